// `meson install` as docs/install.md and docs/deploy.md say: into a DESTDIR, every program,
// library, header, pkg-config file, systemd unit, example and document in its place; the units
// valid for systemd and naming the installed programs; the manager started as its unit starts
// it, on the installed example topology; and a leaf lab brought up, used and taken down from the
// installed tree alone (its treeduce, switch, manager, treeduce-perf and libtreeduce). The lab
// part needs root.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "lab_test_support.h"

namespace {

using namespace treeduce::labtest;

/// `cmd` through sh, stdout and stderr together.
Result run(const std::string& cmd) {
  Result r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// The install directories as the build was configured (tests/lab/meson.build), each absolute.
struct Dirs {
  std::string bin = TREEDUCE_INSTALL_BINDIR, lib = TREEDUCE_INSTALL_LIBDIR,
              include = TREEDUCE_INSTALL_INCLUDEDIR, data = TREEDUCE_INSTALL_DATADIR,
              units = TREEDUCE_INSTALL_UNITDIR, etc = TREEDUCE_INSTALL_SYSCONFDIR;
};

/// `meson install --destdir` of the build tree into `dest`; "" or what went wrong.
std::string install_into(const std::string& dest) {
  const Result r = run(std::string("meson install -C ") + shq(TREEDUCE_BUILD_ROOT) +
                       " --no-rebuild --quiet --destdir " + shq(dest));
  return r.status == 0 ? "" : "meson install failed:\n" + r.out;
}

/// The value of `key=` in a unit file's text, "" if absent.
std::string unit_value(const std::string& unit, const std::string& key) {
  return line_of(unit, key + "=").substr(key.size() + 1);
}

class Install : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/treeduce-install-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    dest_ = dir_ + "/dest";
    ASSERT_EQ(install_into(dest_), "");
  }
  void TearDown() override {
    if (manager_ > 0) {
      kill(manager_, SIGKILL);
      waitpid(manager_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string in_dest(const std::string& path) const { return dest_ + path; }

  Dirs d_;
  std::string dir_, dest_;
  pid_t manager_ = -1;
};

TEST_F(Install, EverythingInItsPlace) {
  const std::vector<std::string> expected = {
      d_.bin + "/treeduce",
      d_.bin + "/treeduce-switch",
      d_.bin + "/treeduce-manager",
      d_.bin + "/treeduce-perf",
      d_.lib + "/libtreeduce.so.0",
      d_.lib + "/pkgconfig/treeduce.pc",
      d_.include + "/treeduce/treeduce.h",
      d_.include + "/treeduce/host/communicator.h",
      d_.include + "/treeduce/aggregation/dtype.h",
      d_.units + "/treeduce-manager.service",
      d_.units + "/treeduce-switch@.service",
      d_.data + "/treeduce/examples/topology.yaml",
      d_.data + "/treeduce/examples/switch-leaf0.yaml",
      d_.data + "/treeduce/examples/switch-leaf0.env",
      d_.data + "/treeduce/examples/manager.env",
      d_.data + "/treeduce/examples/make-certs.sh",
      d_.data + "/treeduce/examples/lab/main-two-level.yaml",
      d_.data + "/doc/treeduce/README.md",
      d_.data + "/doc/treeduce/docs/deploy.md",
      d_.data + "/doc/treeduce/docs/install.md",
  };
  for (const std::string& p : expected) EXPECT_TRUE(fs::exists(in_dest(p))) << p;
  // The front ends where this build has them (not in a sanitizer build, docs/install.md).
  if (TREEDUCE_INSTALL_MPI) {
    for (const std::string& p :
         {d_.lib + "/libtreeduce-mpi.so", d_.lib + "/pkgconfig/treeduce-mpi.pc",
          d_.bin + "/treeduce-mpi-bench"})
      EXPECT_TRUE(fs::exists(in_dest(p))) << p;
  }
  std::string site = TREEDUCE_INSTALL_PYSITE;  // meson ends it with a slash
  while (site.size() > 1 && site.back() == '/') site.pop_back();
  if (!site.empty()) {
    EXPECT_TRUE(fs::exists(in_dest(site + "/treeduce/__init__.py"))) << site;
    EXPECT_TRUE(fs::exists(in_dest(site + "/treeduce/torch/hooks.py"))) << site;
    EXPECT_TRUE(fs::exists(in_dest(d_.data + "/treeduce/examples/ddp_train.py")));
    // The installed package imports from the DESTDIR with the DESTDIR's libtreeduce.
    const Result r = run("cd / && LD_LIBRARY_PATH=" + shq(in_dest(d_.lib)) +
                         " PYTHONPATH=" + shq(in_dest(site)) +
                         " /usr/bin/python3 -c 'import treeduce._C as c, treeduce.torch; "
                         "print(c.__file__)'");
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_TRUE(has(r.out, in_dest(site) + "/treeduce/_C")) << r.out;
  }
  for (const char* b : {"treeduce", "treeduce-switch", "treeduce-manager", "treeduce-perf"})
    EXPECT_TRUE(access(in_dest(d_.bin + "/" + b).c_str(), X_OK) == 0) << b;
}

TEST_F(Install, UnitsAreValidAndStartTheInstalledPrograms) {
  const std::string manager = read_file(in_dest(d_.units + "/treeduce-manager.service"));
  const std::string sw = read_file(in_dest(d_.units + "/treeduce-switch@.service"));
  EXPECT_EQ(unit_value(manager, "ExecStart"),
            d_.bin + "/treeduce-manager --topology " + d_.etc +
                "/treeduce/topology.yaml --db /var/lib/treeduce/manager.db $TREEDUCE_MANAGER_ARGS");
  EXPECT_EQ(unit_value(manager, "EnvironmentFile"), "-" + d_.etc + "/treeduce/manager.env");
  EXPECT_EQ(unit_value(sw, "ExecStart"),
            d_.bin +
                "/treeduce-switch $TREEDUCE_SWITCH_EAL --file-prefix=treeduce-%i -- --config " +
                d_.etc + "/treeduce/switch-%i.yaml");
  EXPECT_EQ(unit_value(sw, "EnvironmentFile"), d_.etc + "/treeduce/switch-%i.env");

  // systemd's own check, with the programs where the DESTDIR has them (verify requires that
  // ExecStart names an executable).
  if (run("command -v systemd-analyze").status != 0) {
    ADD_FAILURE() << "systemd-analyze is missing (Debian package systemd)";
    return;
  }
  for (const std::string u : {"treeduce-manager.service", "treeduce-switch@leaf0.service"}) {
    const std::string text = u == "treeduce-manager.service" ? manager : sw;
    const std::string copy = dir_ + "/" + u;
    std::ofstream(copy) << std::regex_replace(text, std::regex(d_.bin + "/"),
                                              in_dest(d_.bin) + "/");
    const Result r = run("systemd-analyze verify " + shq(copy));
    EXPECT_EQ(r.status, 0) << u << ":\n" << r.out;
    EXPECT_EQ(r.out, "") << u;
  }

  // The manager as its unit starts it: the installed example topology, a database, the example
  // environment file's arguments (listening on a free loopback port here).
  const std::string env = read_file(in_dest(d_.data + "/treeduce/examples/manager.env"));
  std::string args = line_of(env, "TREEDUCE_MANAGER_ARGS=").substr(22);
  args = std::regex_replace(args, std::regex("--listen=\\S+"), "--listen=127.0.0.1:0");
  ASSERT_NE(args.find("--listen=127.0.0.1:0"), std::string::npos) << env;
  // Its certificates, made as docs/deploy.md says with the installed make-certs.sh, where the
  // example expects them (here under the test's directory).
  const std::string tls = dir_ + "/tls";
  const std::string make =
      shq(in_dest(d_.data + "/treeduce/examples/make-certs.sh")) + " " + shq(tls);
  for (const std::string& what :
       {std::string(" ca"), std::string(" treeduce-manager IP:127.0.0.1")}) {
    const Result r = run(make + what);
    ASSERT_EQ(r.status, 0) << r.out;
  }
  ASSERT_NE(args.find("/usr/local/etc/treeduce/tls/"), std::string::npos) << env;
  args = std::regex_replace(args, std::regex("/usr/local/etc/treeduce/tls/"), tls + "/");
  const std::string log = dir_ + "/manager.log";
  const std::string cmd = "exec " + shq(in_dest(d_.bin + "/treeduce-manager")) + " --topology " +
                          shq(in_dest(d_.data + "/treeduce/examples/topology.yaml")) + " --db " +
                          shq(dir_ + "/manager.db") + " " + args + " >" + shq(log) + " 2>&1";
  manager_ = fork();
  if (manager_ == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  bool exited = false;
  EXPECT_TRUE(eventually([&] {
    exited = waitpid(manager_, &st, WNOHANG) == manager_;
    return exited || has(read_file(log), "listening on port");
  }));
  if (exited) manager_ = -1;
  EXPECT_FALSE(exited) << read_file(log);
  EXPECT_TRUE(has(read_file(log), "listening on port")) << read_file(log);
  EXPECT_TRUE(has(read_file(log), "with mutual TLS")) << read_file(log);
}

/// A lab run from the installed tree: the DESTDIR's treeduce, which finds the switch and the
/// manager next to itself; ranks that run the DESTDIR's treeduce-perf on its libtreeduce.
class InstalledLab : public LabTest {
 protected:
  InstalledLab() : LabTest("installlab") {}
  void SetUp() override {
    LabTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    dest_ = root_ + "/dest";
    ASSERT_EQ(install_into(dest_), "");
    cli_ = dest_ + d_.bin + "/treeduce";
    tools_dir_ = dest_ + d_.bin;
  }
  Dirs d_;
  std::string dest_;
};

TEST_F(InstalledLab, LeafLabUpRunDown) {
  // The installed programs have no rpath into the build tree: the DESTDIR's library, by
  // LD_LIBRARY_PATH as ld.so would find it under the prefix.
  const std::string env = "LD_LIBRARY_PATH=" + shq(dest_ + d_.lib);
  const std::string n = name("i");
  Result r = lab({"up", "--leaf", "2", "--name", n}, env);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json st = state(n);
  int switches = 0, managers = 0;
  for (const auto& p : st["procs"]) {
    const std::string argv0 = p["argv"][0];
    if (p["role"] == "switch") {
      ++switches;
      EXPECT_EQ(argv0, dest_ + d_.bin + "/treeduce-switch");
    } else if (p["role"] == "manager") {
      ++managers;
      EXPECT_EQ(argv0, dest_ + d_.bin + "/treeduce-manager");
    }
  }
  EXPECT_EQ(switches, 1);
  EXPECT_EQ(managers, 1);
  r = lab({"run", "--name", n, "--", "sh", "-c",
           "ldd \"$(command -v treeduce-perf)\" | grep libtreeduce; exec treeduce-perf -b 1024 -e "
           "4096 -f 4 -d f32,i32 -o sum -n 2 -w 0 -c 1"},
          env);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "[h0] # treeduce-perf: 2 ranks, path network")) << r.out;
  EXPECT_TRUE(has(r.out, "[h0] # verified: 0 wrong elements")) << r.out;
  EXPECT_TRUE(has(r.out, "[h0] \tlibtreeduce.so.0 => " + dest_ + d_.lib + "/libtreeduce.so.0"))
      << r.out;
  EXPECT_TRUE(has(r.out, "[h1] \tlibtreeduce.so.0 => " + dest_ + d_.lib + "/libtreeduce.so.0"))
      << r.out;
  r = lab({"down", "--name", n}, env);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(root_ + "/" + n));
}

}  // namespace

// pkg-config treeduce as a user's build sees it (docs/host.md, "Build"): in the build tree
// (PKG_CONFIG_PATH=<build>/host) and after `meson install --destdir`. The flags must be the
// public headers' directories and the library, nothing of libtreeduce's private dependencies
// (DPDK's -march=corei7 and -include rte_config.h once lowered a user's -march=native); a C
// program using only the C API builds with -march=native -Werror and runs, and docs/host.md's
// C++ example compiles against the installed headers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Command {
  int status = -1;
  std::string out;
};

Command run(const std::string& cmd) {
  Command r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = ::pclose(p);
  return r;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class PkgConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("treeduce-pkgconfig-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "store");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every word of `flags` is an -I, -L, -l or -Wl,-rpath flag: nothing that changes code
  // generation or defines a macro.
  static void expect_only_paths_and_libs(const std::string& flags) {
    std::istringstream in(flags);
    for (std::string w; in >> w;) {
      const bool ok = w.rfind("-I", 0) == 0 || w.rfind("-L", 0) == 0 || w.rfind("-l", 0) == 0 ||
                      w.rfind("-Wl,-rpath,", 0) == 0;
      EXPECT_TRUE(ok) << "pkg-config passes on \"" << w << "\" in: " << flags;
    }
  }

  // Builds and runs the C user program with `env` in front of pkg-config.
  void build_and_run_user(const std::string& env, const std::string& run_env) {
    const std::string flags = trim(run(env + " pkg-config --cflags --libs treeduce").out);
    const std::string exe = (dir_ / "user").string();
    const Command cc = run(std::string("cc ") + TREEDUCE_SANITIZE +
                           " -std=c11 -Wall -Wextra -Werror -march=native -o " + exe + " " +
                           TREEDUCE_USER_C + " " + flags);
    ASSERT_EQ(cc.status, 0) << cc.out;
    const Command u = run(run_env + " " + exe + " " + (dir_ / "store").string());
    ASSERT_EQ(u.status, 0) << u.out;
    EXPECT_NE(u.out.find("f32 1.5 2 -3 4 u8 0f f0 55 host_ops 2"), std::string::npos) << u.out;
  }

  fs::path dir_;
};

TEST_F(PkgConfig, BuildTreeGivesOnlyTheHeadersAndTheLibrary) {
  const std::string env = std::string("PKG_CONFIG_PATH=") + TREEDUCE_HOST_BUILD;
  const Command cflags = run(env + " pkg-config --cflags treeduce");
  ASSERT_EQ(cflags.status, 0) << cflags.out;
  expect_only_paths_and_libs(cflags.out);
  EXPECT_NE(cflags.out.find("/host/include"), std::string::npos) << cflags.out;
  const Command libs = run(env + " pkg-config --libs treeduce");
  ASSERT_EQ(libs.status, 0) << libs.out;
  expect_only_paths_and_libs(libs.out);
  EXPECT_NE(libs.out.find("-ltreeduce"), std::string::npos) << libs.out;
  build_and_run_user(env, "");
}

TEST_F(PkgConfig, InstalledHeadersAndFileWork) {
  const fs::path dest = dir_ / "dest";
  const Command inst = run(std::string("meson install -C ") + TREEDUCE_BUILD_ROOT +
                           " --no-rebuild --quiet --destdir " + dest.string());
  ASSERT_EQ(inst.status, 0) << inst.out;
  // The .pc file under the destdir; PKG_CONFIG_SYSROOT_DIR points its paths there.
  fs::path pc;
  for (const auto& e : fs::recursive_directory_iterator(dest))
    if (e.path().filename() == "treeduce.pc") pc = e.path();
  ASSERT_FALSE(pc.empty()) << "no treeduce.pc installed";
  const std::string env =
      "PKG_CONFIG_PATH=" + pc.parent_path().string() + " PKG_CONFIG_SYSROOT_DIR=" + dest.string();
  const Command flags = run(env + " pkg-config --cflags --libs treeduce");
  ASSERT_EQ(flags.status, 0) << flags.out;
  expect_only_paths_and_libs(flags.out);
  // The installed library is found through LD_LIBRARY_PATH, as a user's would be by ld.so.
  fs::path lib;
  for (const auto& e : fs::recursive_directory_iterator(dest))
    if (e.path().filename() == "libtreeduce.so") lib = e.path();
  ASSERT_FALSE(lib.empty());
  build_and_run_user(env, "LD_LIBRARY_PATH=" + lib.parent_path().string());

  // docs/host.md's C++ example, taken from the page, compiles against the installed headers.
  std::ifstream doc(std::string(TREEDUCE_SOURCE_ROOT) + "/docs/host.md");
  std::stringstream text;
  text << doc.rdbuf();
  const std::string s = text.str();
  const auto start = s.find("```cpp\n#include <treeduce/host/communicator.h>");
  ASSERT_NE(start, std::string::npos) << "docs/host.md has no C++ example";
  const auto end = s.find("```", start + 6);
  const fs::path example = dir_ / "example.cpp";
  std::ofstream(example) << s.substr(start + 7, end - start - 7);
  const std::string cflags = trim(run(env + " pkg-config --cflags --libs treeduce").out);
  const Command cxx =
      run(std::string("c++ ") + TREEDUCE_SANITIZE + " -std=c++20 -Wall -Werror -march=native -o " +
          (dir_ / "example").string() + " " + example.string() + " " + cflags);
  EXPECT_EQ(cxx.status, 0) << cxx.out;
}

}  // namespace

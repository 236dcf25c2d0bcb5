#include "treeduce/control/topology_source.h"

#include <nlohmann/json.hpp>

#include <cstdint>

namespace treeduce::ctl {

std::string topology_hash(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  static const char* hex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[std::size_t(i)] = hex[h & 15];
  return out;
}

std::string applied_topology_doc(const std::string& yaml, const std::string& file_hash) {
  return nlohmann::json{{"yaml", yaml}, {"file_hash", file_hash}}.dump();
}

namespace {

Result<Topology> parse(const std::string& where, const std::string& text) {
  auto t = load_topology_yaml(text);
  if (!t.ok()) return invalid_argument(where + ": " + t.status().message());
  return t;
}

Status write(Store& st, const std::string* doc) {
  Status s = st.begin();
  if (s.ok())
    s = doc ? st.put(kTopologyTable, kAppliedTopologyKey, *doc)
            : st.erase(kTopologyTable, kAppliedTopologyKey);
  if (s.ok()) s = st.commit();
  return s;
}

}  // namespace

Result<StartupTopology> startup_topology(const std::string& path, const std::string& file_text,
                                         Store* store, TopologySource source) {
  StartupTopology out;
  out.file_hash = topology_hash(file_text);
  std::string applied, applied_file_hash;
  bool have = false;
  if (store) {
    auto rows = store->load(kTopologyTable);
    if (!rows.ok()) return rows.status();
    for (const auto& [key, doc] : *rows) {
      if (key != kAppliedTopologyKey) continue;
      try {
        const auto d = nlohmann::json::parse(doc);
        applied = d.at("yaml").get<std::string>();
        applied_file_hash = d.at("file_hash").get<std::string>();
        have = true;
      } catch (const nlohmann::json::exception& e) {
        return internal_error(
            "The applied topology in the state database is damaged (" + std::string(e.what()) +
            "); start with --topology-source file to replace it with '" + path + "'.");
      }
    }
  }
  const bool file_unchanged = have && applied_file_hash == out.file_hash;
  const bool file_is_applied = have && topology_hash(applied) == out.file_hash;
  const bool use_db =
      have && (source == TopologySource::db ||
               (source == TopologySource::automatic && file_unchanged && !file_is_applied));
  if (have && source == TopologySource::automatic && !file_unchanged && !file_is_applied)
    return failed_precondition(
        "The topology file '" + path +
        "' was edited after a topology was applied at run time (treeduce set-topology) and the "
        "state database keeps that one: start with --topology-source db to keep the applied "
        "topology (then apply the file with treeduce set-topology if you want it), or with "
        "--topology-source file to replace it with the file's.");
  if (use_db) {
    auto t = parse("the topology applied at run time (state database)", applied);
    if (!t.ok()) return t.status();
    out.topo = std::move(*t);
    out.note = source == TopologySource::db
                   ? "the topology applied at run time, as --topology-source db asks (kept in "
                     "the state database instead of '" +
                         path + "')"
                   : "the topology applied at run time (kept in the state database; '" + path +
                         "' is unchanged since)";
    if (applied_file_hash != out.file_hash) {
      // Chosen over this file: the next start with the same file needs no flag.
      const std::string doc = applied_topology_doc(applied, out.file_hash);
      if (Status s = write(*store, &doc); !s.ok()) return s;
    }
    return out;
  }
  auto t = parse(path, file_text);
  if (!t.ok()) return t.status();
  out.topo = std::move(*t);
  if (have) {
    out.note = file_is_applied ? "'" + path + "', which now holds the topology applied at run time"
                               : "'" + path +
                                     "', as --topology-source file asks (the topology applied "
                                     "at run time is dropped)";
    // The file is the truth from now on.
    if (Status s = write(*store, nullptr); !s.ok()) return s;
  }
  return out;
}

}  // namespace treeduce::ctl

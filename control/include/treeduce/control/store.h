/// @file
/// Durable state of the manager: documents (JSON text) by key in three tables, "jobs",
/// "switches" and "topology" (a topology applied at run time, topology_source.h). Behind a small
/// interface so the registry does not know the backend (bmv2 dev_mgr-style); the SQLite backend is
/// the one the daemon uses (docs/manager.md says why).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "treeduce/common/status.h"

namespace treeduce::ctl {

/// Key/document storage with transactions. Not thread-safe: the registry serialises calls.
class Store {
 public:
  virtual ~Store() = default;
  /// `table` is "jobs", "switches" or "topology".
  virtual Status put(std::string_view table, const std::string& key, const std::string& doc) = 0;
  virtual Status erase(std::string_view table, const std::string& key) = 0;
  virtual Result<std::vector<std::pair<std::string, std::string>>> load(std::string_view table) = 0;
  /// Groups the puts and erases of one registry change, so a crash never leaves half of it.
  virtual Status begin() = 0;
  virtual Status commit() = 0;
};

/// Opens (creating if needed) an SQLite database at `path`.
Result<std::unique_ptr<Store>> open_sqlite_store(const std::string& path);

}  // namespace treeduce::ctl

// SQLite backend of Store. WAL journal with synchronous=NORMAL: a commit is durable against a
// process crash (the case a manager restart is about); a power loss may lose the last commits,
// which only costs jobs that then time out and rejoin.
#include <sqlite3.h>

#include "treeduce/control/store.h"

namespace treeduce::ctl {

namespace {

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override {
    for (auto* s : {put_jobs_, put_sw_, put_topo_, del_jobs_, del_sw_, del_topo_})
      sqlite3_finalize(s);
    sqlite3_close(db_);
  }

  Status init() {
    if (Status s = exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);"
                        "INSERT OR IGNORE INTO meta VALUES('schema', '1');"
                        "CREATE TABLE IF NOT EXISTS jobs(key TEXT PRIMARY KEY, doc TEXT NOT NULL);"
                        "CREATE TABLE IF NOT EXISTS switches(key TEXT PRIMARY KEY, doc TEXT "
                        "NOT NULL);"
                        "CREATE TABLE IF NOT EXISTS topology(key TEXT PRIMARY KEY, doc TEXT "
                        "NOT NULL);");
        !s.ok())
      return s;
    for (auto [sql, out] : {std::pair{"INSERT OR REPLACE INTO jobs VALUES(?, ?)", &put_jobs_},
                            {"INSERT OR REPLACE INTO switches VALUES(?, ?)", &put_sw_},
                            {"INSERT OR REPLACE INTO topology VALUES(?, ?)", &put_topo_},
                            {"DELETE FROM topology WHERE key = ?", &del_topo_},
                            {"DELETE FROM jobs WHERE key = ?", &del_jobs_},
                            {"DELETE FROM switches WHERE key = ?", &del_sw_}})
      if (sqlite3_prepare_v2(db_, sql, -1, out, nullptr) != SQLITE_OK) return err("prepare");
    return Status::Ok();
  }

  Status put(std::string_view table, const std::string& key, const std::string& doc) override {
    sqlite3_stmt* s = table == "jobs"       ? put_jobs_
                      : table == "switches" ? put_sw_
                      : table == "topology" ? put_topo_
                                            : nullptr;
    if (!s) return invalid_argument("There is no table '" + std::string(table) + "'.");
    sqlite3_bind_text(s, 1, key.data(), int(key.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, doc.data(), int(doc.size()), SQLITE_TRANSIENT);
    return step(s);
  }

  Status erase(std::string_view table, const std::string& key) override {
    sqlite3_stmt* s = table == "jobs"       ? del_jobs_
                      : table == "switches" ? del_sw_
                      : table == "topology" ? del_topo_
                                            : nullptr;
    if (!s) return invalid_argument("There is no table '" + std::string(table) + "'.");
    sqlite3_bind_text(s, 1, key.data(), int(key.size()), SQLITE_TRANSIENT);
    return step(s);
  }

  Result<std::vector<std::pair<std::string, std::string>>> load(std::string_view table) override {
    if (table != "jobs" && table != "switches" && table != "topology")
      return invalid_argument("There is no table '" + std::string(table) + "'.");
    const std::string sql = "SELECT key, doc FROM " + std::string(table) + " ORDER BY key";
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) return err("load");
    std::vector<std::pair<std::string, std::string>> out;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
      out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)),
                       reinterpret_cast<const char*>(sqlite3_column_text(s, 1)));
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return err("load");
    return out;
  }

  Status begin() override { return exec("BEGIN"); }
  Status commit() override { return exec("COMMIT"); }

 private:
  Status err(const char* what) {
    return internal_error(std::string("The state database failed (") + what +
                          "): " + sqlite3_errmsg(db_) + ".");
  }
  Status exec(const char* sql) {
    char* msg = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
      std::string m = msg ? msg : "unknown error";
      sqlite3_free(msg);
      return internal_error("The state database failed: " + m + ".");
    }
    return Status::Ok();
  }
  Status step(sqlite3_stmt* s) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc == SQLITE_DONE ? Status::Ok() : err("write");
  }

  sqlite3* db_;
  sqlite3_stmt *put_jobs_ = nullptr, *put_sw_ = nullptr, *put_topo_ = nullptr, *del_jobs_ = nullptr,
               *del_sw_ = nullptr, *del_topo_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Store>> open_sqlite_store(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return unavailable("Cannot open the state database '" + path + "': " + m + ".");
  }
  sqlite3_busy_timeout(db, 2000);
  auto s = std::make_unique<SqliteStore>(db);
  if (Status st = s->init(); !st.ok()) return st;
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace treeduce::ctl

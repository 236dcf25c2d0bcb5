#include "config.h"

#include <cerrno>
#include <cstdlib>

namespace treeduce::mpi {
namespace {

// A decimal unsigned number with an optional K/M/G suffix (binary: 1K = 1024), the whole string.
bool parse_size(const std::string& s, bool allow_suffix, std::uint64_t* out) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0) return false;
  std::uint64_t mult = 1;
  std::string rest(end);
  if (allow_suffix && !rest.empty()) {
    if (rest == "K" || rest == "k")
      mult = 1ULL << 10;
    else if (rest == "M" || rest == "m")
      mult = 1ULL << 20;
    else if (rest == "G" || rest == "g")
      mult = 1ULL << 30;
    else
      return false;
    rest.clear();
  }
  if (!rest.empty()) return false;
  if (v > UINT64_MAX / mult) return false;
  *out = v * mult;
  return true;
}

}  // namespace

const char* to_string(Mode m) {
  switch (m) {
    case Mode::off:
      return "off";
    case Mode::on:
      return "on";
    case Mode::force:
      return "force";
  }
  return "?";
}

Config parse_config(const Lookup& raw_lookup, std::string* error) {
  // An empty value is the variable's default, as for libtreeduce's variables.
  const auto lookup = [&](const char* name) -> std::optional<std::string> {
    auto v = raw_lookup(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  Config c;
  error->clear();
  auto fail = [&](std::string sentence) {
    *error = std::move(sentence);
    Config off;
    off.mode = Mode::off;
    off.stats = c.stats;
    return off;
  };
  if (auto v = lookup("TREEDUCE_MPI_STATS")) {
    if (*v == "1")
      c.stats = true;
    else if (*v == "0")
      c.stats = false;
    else
      return fail("TREEDUCE_MPI_STATS is '" + *v + "'; it must be 0 or 1.");
  }
  if (auto v = lookup("TREEDUCE_MPI")) {
    if (*v == "off")
      c.mode = Mode::off;
    else if (*v == "on")
      c.mode = Mode::on;
    else if (*v == "force")
      c.mode = Mode::force;
    else
      return fail("TREEDUCE_MPI is '" + *v + "'; it must be off, on or force.");
  }
  if (auto v = lookup("TREEDUCE_MPI_MIN_RANKS")) {
    std::uint64_t n = 0;
    if (!parse_size(*v, false, &n) || n < 1 || n > 1000000) {
      return fail("TREEDUCE_MPI_MIN_RANKS is '" + *v +
                  "'; it must be a number of ranks from 1 to 1000000.");
    }
    c.min_ranks = static_cast<std::uint32_t>(n);
  }
  if (auto v = lookup("TREEDUCE_MPI_MIN_BYTES")) {
    if (!parse_size(*v, true, &c.min_bytes)) {
      return fail("TREEDUCE_MPI_MIN_BYTES is '" + *v +
                  "'; it must be a number of bytes, optionally followed by K, M or G.");
    }
  }
  if (auto v = lookup("TREEDUCE_MPI_MAX_BYTES")) {
    if (!parse_size(*v, true, &c.max_bytes)) {
      return fail("TREEDUCE_MPI_MAX_BYTES is '" + *v +
                  "'; it must be a number of bytes, optionally followed by K, M or G.");
    }
  }
  if (c.min_bytes > c.max_bytes) {
    return fail("TREEDUCE_MPI_MIN_BYTES (" + std::to_string(c.min_bytes) +
                ") is above TREEDUCE_MPI_MAX_BYTES (" + std::to_string(c.max_bytes) +
                "): no message could be offloaded.");
  }
  return c;
}

}  // namespace treeduce::mpi

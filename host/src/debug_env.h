// TREEDUCE_DEBUG, the one variable read outside environment.cpp (by the transports, which carry
// no Options): docs/host.md, "Environment".
#pragma once

#include <string_view>

namespace treeduce::host {

/// Whether TREEDUCE_DEBUG's value `v` (std::getenv's) turns debug lines on: set, not empty and
/// not "0" (an empty variable is unset, as every other one is).
inline bool debug_on(const char* v) {
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

}  // namespace treeduce::host

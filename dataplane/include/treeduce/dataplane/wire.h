/// @file
/// The wire format moved to the protocol module (treeduce/protocol/wire.h); the switch core uses
/// its names unqualified.
#pragma once

#include "treeduce/protocol/tree.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::dp {
using namespace treeduce::proto;  // NOLINT(google-build-using-namespace)
}  // namespace treeduce::dp

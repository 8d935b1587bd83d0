// Memory that MPI may still write into or read from after its owner is done
// with it: the buffers of requests that an abort left pending (an MPI
// request can be neither cancelled portably nor waited for when the peer is
// gone). Kept, reachable, until the process exits, so a late message from
// a peer lands in memory nobody else uses (and leak checkers see it held).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace hvdlite {

void KeepPointerUntilExit(std::shared_ptr<void> memory);

// Moves `value` (a buffer, a vector of requests' buffers) to where it is kept.
template <typename T>
void KeepUntilExit(T&& value) {
  KeepPointerUntilExit(std::make_shared<std::decay_t<T>>(std::forward<T>(value)));
}

}  // namespace hvdlite

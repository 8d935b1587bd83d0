// A copy whose stores bypass this core's caches (non-temporal stores), for
// data another process reads next: the shared-memory collectives' slots.
//
// A plain store leaves the line modified in this core's cache, so the peer
// that reads it next takes it from this core (a cache-to-cache transfer), and
// this core's next write to the line must first take it back from the peer.
// Where the two cores are far apart (virtual CPUs placed on different dies or
// sockets by the host), those transfers ran at 2.3 GB/s instead of 14-18 GB/s,
// for seconds at a time, and made an allreduce through shared memory up to 7x
// slower. Written around the caches, the line is read from memory at full
// speed wherever the reader runs (bench/results/2026-11-26-streaming-stores).
#pragma once

#include <cstddef>

namespace hvdlite {

// memcpy's contract (no overlap). The stores are ordered before any later
// store of this thread (a release of the counter that publishes them).
void StreamingCopy(void* dst, const void* src, size_t bytes);

}  // namespace hvdlite

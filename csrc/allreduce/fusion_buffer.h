// Reusable, 64-byte aligned staging buffers for fused and compressed
// collectives. Two of each kind, so one bucket can be packed while the
// previous one is on the wire.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hvdlite {

class FusionBuffer {
 public:
  static constexpr int kSlots = 2;
  enum Kind { kSend = 0, kGather = 1 };

  FusionBuffer() = default;
  ~FusionBuffer();
  FusionBuffer(const FusionBuffer&) = delete;
  FusionBuffer& operator=(const FusionBuffer&) = delete;

  // A buffer of at least `bytes`, kept and reused across calls; nullptr when
  // memory cannot be had.
  uint8_t* Get(Kind kind, int slot, size_t bytes);
  // Bytes held by all buffers.
  int64_t held_bytes() const;

 private:
  uint8_t* data_[2][kSlots] = {};
  size_t capacity_[2][kSlots] = {};
};

}  // namespace hvdlite

#include "allreduce/fusion_buffer.h"

#include "engine/work.h"

namespace hvdlite {

FusionBuffer::~FusionBuffer() {
  for (auto& kind : data_) {
    for (auto* p : kind) FreeAligned(p);
  }
}

uint8_t* FusionBuffer::Get(Kind kind, int slot, size_t bytes) {
  uint8_t*& data = data_[kind][slot];
  size_t& capacity = capacity_[kind][slot];
  if (bytes > capacity || data == nullptr) {
    FreeAligned(data);
    // Grow geometrically so a slowly growing model does not reallocate often.
    size_t want = bytes > capacity * 3 / 2 ? bytes : capacity * 3 / 2;
    data = static_cast<uint8_t*>(AllocateAligned(want));
    capacity = data ? want : 0;
  }
  return data;
}

int64_t FusionBuffer::held_bytes() const {
  int64_t total = 0;
  for (const auto& kind : capacity_) {
    for (size_t c : kind) total += static_cast<int64_t>(c);
  }
  return total;
}

}  // namespace hvdlite

// What an allreduce work of a wire reduces in place: the buffer, its
// elements and reduction, and the scale applied once the sum is complete.
#pragma once

#include <cstdint>

#include "common/common.h"
#include "kernels/scale.h"

namespace hvdlite {

struct InPlaceReduction {
  InPlaceReduction(void* data, int64_t count, DataType dtype, ReduceOp op, double scale)
      : data(static_cast<uint8_t*>(data)), count(count), dtype(dtype), op(op), scale(scale),
        elem(static_cast<int64_t>(DataTypeSize(dtype))) {}

  // Multiplies the sum by the scale (Average's 1/size, a prescale).
  void ApplyScale() const {
    if (scale != 1.0) CopyScaled(data, data, count, dtype, scale);
  }

  uint8_t* data;
  int64_t count;
  DataType dtype;
  ReduceOp op;
  double scale;
  int64_t elem;  // bytes per element
};

}  // namespace hvdlite

// Element-wise kernels on raw buffers: copy with a scale factor (prescale,
// postscale, Average) and the 16-bit float conversions used by reductions.
#pragma once

#include <cstdint>

#include "common/common.h"

namespace hvdlite {

// out[i] = in[i] * factor, in the buffer's own type (integers truncate toward
// zero, as numpy's astype does). in == out is allowed.
void CopyScaled(const void* in, void* out, int64_t count, DataType dtype, double factor);

// 16-bit float buffers widened to float32 and narrowed back, with a factor
// applied in float32 so Average of float16 does not overflow before dividing.
void WidenToFloat(const void* in, float* out, int64_t count, DataType dtype, double factor);
void NarrowFromFloat(const float* in, void* out, int64_t count, DataType dtype, double factor);

}  // namespace hvdlite

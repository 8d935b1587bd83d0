#include "kernels/scale.h"

#include <cstring>

#include "kernels/half.h"

namespace hvdlite {

namespace {

template <typename T>
void ScaleTyped(const T* in, T* out, int64_t count, double factor) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<double>(in[i]) * factor);
}

template <>
void ScaleTyped<float>(const float* in, float* out, int64_t count, double factor) {
  const float f = static_cast<float>(factor);
  for (int64_t i = 0; i < count; ++i) out[i] = in[i] * f;
}

}  // namespace

void CopyScaled(const void* in, void* out, int64_t count, DataType dtype, double factor) {
  if (factor == 1.0) {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(count) * DataTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8:
      ScaleTyped(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), count, factor);
      break;
    case DataType::kInt8:
      ScaleTyped(static_cast<const int8_t*>(in), static_cast<int8_t*>(out), count, factor);
      break;
    case DataType::kUInt16:
      ScaleTyped(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), count, factor);
      break;
    case DataType::kInt16:
      ScaleTyped(static_cast<const int16_t*>(in), static_cast<int16_t*>(out), count, factor);
      break;
    case DataType::kInt32:
      ScaleTyped(static_cast<const int32_t*>(in), static_cast<int32_t*>(out), count, factor);
      break;
    case DataType::kInt64:
      ScaleTyped(static_cast<const int64_t*>(in), static_cast<int64_t*>(out), count, factor);
      break;
    case DataType::kFloat32:
      ScaleTyped(static_cast<const float*>(in), static_cast<float*>(out), count, factor);
      break;
    case DataType::kFloat64:
      ScaleTyped(static_cast<const double*>(in), static_cast<double*>(out), count, factor);
      break;
    case DataType::kFloat16: {
      auto* src = static_cast<const uint16_t*>(in);
      auto* dst = static_cast<uint16_t*>(out);
      const float f = static_cast<float>(factor);
      for (int64_t i = 0; i < count; ++i) dst[i] = FloatToHalf(HalfToFloat(src[i]) * f);
      break;
    }
    case DataType::kBFloat16: {
      auto* src = static_cast<const uint16_t*>(in);
      auto* dst = static_cast<uint16_t*>(out);
      const float f = static_cast<float>(factor);
      for (int64_t i = 0; i < count; ++i) dst[i] = FloatToBFloat16(BFloat16ToFloat(src[i]) * f);
      break;
    }
    case DataType::kBool:
      if (in != out) std::memcpy(out, in, static_cast<size_t>(count));
      break;
  }
}

void WidenToFloat(const void* in, float* out, int64_t count, DataType dtype, double factor) {
  auto* src = static_cast<const uint16_t*>(in);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) {
    for (int64_t i = 0; i < count; ++i) out[i] = HalfToFloat(src[i]) * f;
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = BFloat16ToFloat(src[i]) * f;
  }
}

void NarrowFromFloat(const float* in, void* out, int64_t count, DataType dtype, double factor) {
  auto* dst = static_cast<uint16_t*>(out);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) {
    for (int64_t i = 0; i < count; ++i) dst[i] = FloatToHalf(in[i] * f);
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = FloatToBFloat16(in[i] * f);
  }
}

}  // namespace hvdlite

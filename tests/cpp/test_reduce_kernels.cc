// Checks of csrc/kernels/reduce_kernels.h, the element-wise reductions every wire
// uses: ReduceInto and ReduceSources against a scalar model of each
// (type, op), integer wrap-around, 16-bit floats combined in float32 and
// rounded per step, the scale's arithmetic equal to CopyScaled's, the
// streamed float32 sum equal to ReduceSources, and the MPI
// user ops for 16-bit floats equal to the kernels (MPI_Reduce_local, so no
// launcher is needed).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "transport/mpi/mpi_transport.h"
#include "kernels/half.h"
#include "kernels/reduce_kernels.h"
#include "kernels/scale.h"

using namespace hvdlite;

namespace {

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

// A scalar model: values as double, combined with `op`, then the type's rule.
template <typename T>
T Model(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return a < b ? b : a;
    case ReduceOp::kProduct:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(a)) *
                              static_cast<uint64_t>(static_cast<int64_t>(b)));
      } else {
        return a * b;
      }
    default:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(a)) +
                              static_cast<uint64_t>(static_cast<int64_t>(b)));
      } else {
        return a + b;
      }
  }
}

template <typename T>
std::vector<T> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_integral_v<T>) {
      x = static_cast<T>(rng());  // full range: sums and products wrap
    } else {
      x = static_cast<T>(std::uniform_real_distribution<double>(-100, 100)(rng));
    }
  }
  return v;
}

template <typename T>
void CheckType(DataType dtype) {
  for (ReduceOp op : kOps) {
    CHECK(ElementwiseReducible(dtype, op), "%s reducible", DataTypeName(dtype));
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      // Four sources, as four ranks would give them.
      std::vector<std::vector<T>> src;
      for (uint32_t k = 0; k < 4; ++k) src.push_back(Random<T>(n, 17 * k + static_cast<uint32_t>(n)));
      std::vector<T> want(n);
      for (size_t i = 0; i < n; ++i) {
        T acc = src[0][i];
        for (size_t k = 1; k < src.size(); ++k) acc = Model(acc, src[k][i], op);
        want[i] = acc;
      }
      std::vector<const uint8_t*> ptrs;
      for (auto& s : src) ptrs.push_back(reinterpret_cast<const uint8_t*>(s.data()));
      std::vector<T> got(n);
      ReduceSources(ptrs, got.data(), static_cast<int64_t>(n), dtype, op, 1.0);
      CHECK(got == want, "ReduceSources %s %s n=%zu",
            DataTypeName(dtype), ReduceOpName(op), n);
      // Pairwise, as MPI applies a user op; and in place over src[0].
      std::vector<T> pair(src[1]);
      ReduceInto(src[0].data(), pair.data(), static_cast<int64_t>(n), dtype, op);
      bool pair_ok = true;
      for (size_t i = 0; i < n; ++i) pair_ok &= pair[i] == Model(src[0][i], src[1][i], op);
      CHECK(pair_ok, "ReduceInto %s %s n=%zu", DataTypeName(dtype), ReduceOpName(op), n);
      std::vector<T> aliased(src[0]);
      ptrs[0] = reinterpret_cast<const uint8_t*>(aliased.data());
      ReduceSources(ptrs, aliased.data(), static_cast<int64_t>(n), dtype, op, 1.0);
      CHECK(aliased == want, "ReduceSources into its first source %s", DataTypeName(dtype));
    }
  }
  // The scale is CopyScaled's arithmetic, so both wires agree bit for bit.
  std::vector<T> a = Random<T>(100, 1), b = Random<T>(100, 2);
  std::vector<const uint8_t*> two = {reinterpret_cast<const uint8_t*>(a.data()),
                                     reinterpret_cast<const uint8_t*>(b.data())};
  std::vector<T> scaled(100), sum(100), want(100);
  ReduceSources(two, scaled.data(), 100, dtype, ReduceOp::kSum, 0.25);
  ReduceSources(two, sum.data(), 100, dtype, ReduceOp::kSum, 1.0);
  CopyScaled(sum.data(), want.data(), 100, dtype, 0.25);
  CHECK(scaled == want, "scale of %s", DataTypeName(dtype));
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Check16(DataType dtype) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-60, 60);
  const int64_t n = 1003;
  std::vector<std::vector<uint16_t>> src(3, std::vector<uint16_t>(n));
  for (auto& s : src) {
    for (auto& x : s) x = FromFloat(dist(rng));
  }
  for (ReduceOp op : kOps) {
    std::vector<uint16_t> want(n);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t acc = src[0][i];
      for (size_t k = 1; k < src.size(); ++k) acc = FromFloat(Model(ToFloat(src[k][i]), ToFloat(acc), op));
      want[i] = acc;
    }
    std::vector<const uint8_t*> ptrs;
    for (auto& s : src) ptrs.push_back(reinterpret_cast<const uint8_t*>(s.data()));
    std::vector<uint16_t> got(n);
    ReduceSources(ptrs, got.data(), n, dtype, op, 1.0);
    CHECK(got == want, "ReduceSources %s %s", DataTypeName(dtype), ReduceOpName(op));
    // MPI's user op for the pair gives the kernels' bits.
    MPI_Datatype type;
    MPI_Op mpi_op;
    CHECK(MpiReduction(dtype, op, &type, &mpi_op), "MPI reduction of %s %s", DataTypeName(dtype),
          ReduceOpName(op));
    std::vector<uint16_t> via_mpi(src[1]), via_kernel(src[1]);
    MPI_Reduce_local(src[0].data(), via_mpi.data(), static_cast<int>(n), type, mpi_op);
    ReduceInto(src[0].data(), via_kernel.data(), n, dtype, op);
    CHECK(via_mpi == via_kernel, "MPI user op == kernel for %s %s", DataTypeName(dtype),
          ReduceOpName(op));
  }
}

void TestIntegers() {
  CheckType<uint8_t>(DataType::kUInt8);
  CheckType<int8_t>(DataType::kInt8);
  CheckType<uint16_t>(DataType::kUInt16);
  CheckType<int16_t>(DataType::kInt16);
  CheckType<int32_t>(DataType::kInt32);
  CheckType<int64_t>(DataType::kInt64);
}

void TestFloats() {
  CheckType<float>(DataType::kFloat32);
  CheckType<double>(DataType::kFloat64);
}

void TestHalfAndBFloat16() {
  Check16<HalfToFloat, FloatToHalf>(DataType::kFloat16);
  Check16<BFloat16ToFloat, FloatToBFloat16>(DataType::kBFloat16);
  // A half sum that leaves the range is inf, not a wrapped value.
  uint16_t x = FloatToHalf(60000.0f), y = FloatToHalf(60000.0f);
  ReduceInto(&x, &y, 1, DataType::kFloat16, ReduceOp::kSum);
  CHECK(y == 0x7c00, "overflow -> inf, got %04x", y);
}

// The one-pass streamed float32 sum gives ReduceSources' bits in both
// destinations, whatever the alignment they share, the sources' count, the
// scale, and a destination that is one of the sources (rank 1's own part).
void TestStreamingSum() {
  const int64_t kMax = 1003;
  std::vector<std::vector<float>> src;
  for (uint32_t k = 0; k < 4; ++k) src.push_back(Random<float>(kMax + 8, 40 + k));
  for (size_t k = 1; k <= 4; ++k) {
    for (double scale : {1.0, 0.5, 1.0 / 3.0}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{16}, int64_t{17}, kMax}) {
        for (int shift = 0; shift < 4; ++shift) {  // floats past a 16-byte boundary, both destinations
          std::vector<const uint8_t*> ptrs;
          for (size_t r = 0; r < k; ++r) ptrs.push_back(reinterpret_cast<const uint8_t*>(src[r].data()));
          std::vector<float> want(static_cast<size_t>(n));
          ReduceSources(ptrs, want.data(), n, DataType::kFloat32, ReduceOp::kSum, scale);
          alignas(16) static float out[kMax + 8], copy[kMax + 8];
          std::fill(out, out + kMax + 8, -1.0f);
          std::fill(copy, copy + kMax + 8, -1.0f);
          const ReduceOp op = shift % 2 ? ReduceOp::kAverage : ReduceOp::kSum;  // Average sums
          const bool took = ReduceSourcesStreaming(ptrs, out + shift, copy + shift, n, DataType::kFloat32, op, scale);
          CHECK(took, "streamed sum taken, %zu sources", k);
          CHECK(n == 0 || (std::memcmp(out + shift, want.data(), n * sizeof(float)) == 0 &&
                           std::memcmp(copy + shift, want.data(), n * sizeof(float)) == 0),
                "streamed sum == ReduceSources, %zu sources, scale %g, n=%lld, shift %d", k, scale,
                static_cast<long long>(n), shift);
          CHECK(out[shift + n] == -1.0f && copy[shift + n] == -1.0f && (shift == 0 || out[shift - 1] == -1.0f),
                "nothing written outside n=%lld", static_cast<long long>(n));
        }
        // The copy into a source, as the rank that owns part 1 writes its own gradient.
        if (k >= 2) {
          std::vector<float> mine(src[1].begin(), src[1].begin() + n), result(static_cast<size_t>(n));
          std::vector<const uint8_t*> ptrs;
          for (size_t r = 0; r < k; ++r) {
            ptrs.push_back(reinterpret_cast<const uint8_t*>(r == 1 ? mine.data() : src[r].data()));
          }
          std::vector<float> want(static_cast<size_t>(n));
          ReduceSources(ptrs, want.data(), n, DataType::kFloat32, ReduceOp::kSum, scale);
          const bool aligned = (reinterpret_cast<uintptr_t>(result.data()) -
                                reinterpret_cast<uintptr_t>(mine.data())) % 16 == 0;
          if (aligned && ReduceSourcesStreaming(ptrs, result.data(), mine.data(), n, DataType::kFloat32,
                                                ReduceOp::kSum, scale)) {
            CHECK(mine == want && result == want, "streamed sum into its own source, %zu sources", k);
          }
        }
      }
    }
  }
  // Not taken, nothing written: other types and ops, destinations aligned apart.
  std::vector<const uint8_t*> two = {reinterpret_cast<const uint8_t*>(src[0].data()),
                                     reinterpret_cast<const uint8_t*>(src[1].data())};
  alignas(16) float a[64], b[64];
  std::fill(a, a + 64, 7.0f);
  std::fill(b, b + 64, 7.0f);
  CHECK(!ReduceSourcesStreaming(two, a, b, 32, DataType::kFloat64, ReduceOp::kSum, 1.0), "float64 not taken");
  CHECK(!ReduceSourcesStreaming(two, a, b, 32, DataType::kFloat32, ReduceOp::kMax, 1.0), "Max not taken");
  CHECK(!ReduceSourcesStreaming(two, a + 1, b, 32, DataType::kFloat32, ReduceOp::kSum, 1.0),
        "destinations aligned apart not taken");
  CHECK(std::all_of(a, a + 64, [](float x) { return x == 7.0f; }) &&
            std::all_of(b, b + 64, [](float x) { return x == 7.0f; }),
        "nothing written when not taken");
}

void TestRefused() {
  CHECK(!ElementwiseReducible(DataType::kBool, ReduceOp::kSum), "bool is not reducible");
  CHECK(!ElementwiseReducible(DataType::kFloat32, ReduceOp::kAdasum), "Adasum is not element-wise");
  MPI_Datatype type;
  MPI_Op op;
  CHECK(!MpiReduction(DataType::kBool, ReduceOp::kSum, &type, &op), "no MPI reduction of bool");
  CHECK(MpiReduction(DataType::kFloat32, ReduceOp::kAverage, &type, &op) && op == MPI_SUM,
        "Average is a Sum on the wire");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = hvdlite_test::RunTests({{"integers", TestIntegers},
                                         {"floats", TestFloats},
                                         {"half_and_bfloat16", TestHalfAndBFloat16},
                                         {"streaming_sum", TestStreamingSum},
                                         {"refused", TestRefused}});
  MPI_Finalize();
  return rc;
}

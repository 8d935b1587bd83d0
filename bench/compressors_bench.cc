// Micro-benchmark of csrc/compressors on the ResNet-50 gradient size
// (25,557,032 float32), single-threaded, against memcpy of the same buffer.
// Not a test. Built against the engine by bench/cpp.py:
//   python bench/cpp.py compressors_bench       # prints the binary's path
//   <binary> [reps [floats]]
// (python -m hvdlite.bench builds and runs it as its "compression kernels" case.)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "transport/abort_signal.h"
#include "transport/mpi/mpi_transport.h"
#include "compressors/bf16.h"
#include "compressors/compressor.h"
#include "compressors/density_warmup.h"
#include "compressors/error_feedback.h"
#include "compressors/fp16.h"
#include "compressors/momentum_correction.h"
#include "compressors/powersgd.h"
#include "compressors/topk.h"

using namespace hvdlite;

namespace {

int64_t kN = 25557032;  // ResNet-50's parameters (or argv[2])
int g_reps = 7;

// Wall time and this thread's CPU time: on a shared machine the CPU time
// (best of the reps) is the steadier measure of a kernel's own cost.
struct Result {
  double median, best, cpu_best;
};

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

Result Time(const std::function<void()>& fn, int reps = -1) {
  if (reps < 0) reps = g_reps;
  std::vector<double> ms, cpu;
  fn();  // warm: page faults, lazy init
  for (int r = 0; r < reps; ++r) {
    const double c0 = ThreadCpuMs();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    cpu.push_back(ThreadCpuMs() - c0);
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms[0], *std::min_element(cpu.begin(), cpu.end())};
}

Result g_memcpy;
void Row(const char* name, Result r) {
  std::printf("%-46s %8.2f %8.2f %8.2f   %5.2fx  %5.2fx\n", name, r.median, r.best, r.cpu_best,
              r.best / g_memcpy.best, r.cpu_best / g_memcpy.cpu_best);
}

// Gradient-like data: roughly normal (sum of uniforms), cheap to make.
std::vector<float> Gradients(int64_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < 4; ++j) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      acc += static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
    }
    v[i] = (acc - 2.0f) * 1e-3f;
  }
  return v;
}

// 161 segments with sizes spread over four orders of magnitude, like a CNN's tensors.
std::vector<Segment> ManySegments(int64_t n) {
  std::vector<double> w(161);
  for (int i = 0; i < 161; ++i) w[i] = std::pow(10.0, 0.025 * ((i * 37) % 161));
  double total = 0;
  for (double x : w) total += x;
  std::vector<Segment> segs;
  int64_t off = 0;
  for (int i = 0; i < 161; ++i) {
    int64_t c = i == 160 ? n - off : std::max<int64_t>(1, static_cast<int64_t>(w[i] / total * n));
    segs.push_back({"t" + std::to_string(i), off, c});
    off += c;
  }
  return segs;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc > 1) g_reps = std::max(1, std::atoi(argv[1]));
  if (argc > 2) kN = std::max<int64_t>(1000, std::atoll(argv[2]));
  std::vector<float> x = Gradients(kN, 1);
  std::vector<float> y(kN, 0.0f);
  std::vector<uint16_t> h(kN, 0), h2(kN, 0);
  const std::vector<Segment> one = {{"all", 0, kN}};
  const std::vector<Segment> many = ManySegments(kN);

  std::printf("%lld float32 (%.1f MB), %d reps, fp16 kernels: %s\n", static_cast<long long>(kN),
              kN * 4 / 1e6, g_reps, BestFp16Kernels().name);
  std::printf("%-46s %8s %8s %8s   %s\n", "ms", "median", "best", "cpu best",
              "best/memcpy (wall, cpu)");
  Result mc = Time([&] { std::memcpy(y.data(), x.data(), kN * 4); });
  g_memcpy = mc;
  Row("memcpy float32 (the whole buffer)", mc);
  Row("memcpy of half the bytes (the fp16 buffer)", Time([&] { std::memcpy(h2.data(), h.data(), kN * 2); }));

  const Fp16Kernels& k = BestFp16Kernels();
  const Fp16Kernels& s = ScalarFp16Kernels();
  Result to_half = Time([&] { k.to_half(x.data(), h.data(), kN); });
  Result to_float = Time([&] { k.to_float(h.data(), y.data(), kN); });
  Row("fp16 compress (float -> half)", to_half);
  Row("fp16 decompress (half -> float)", to_float);
  Row("fp16 round trip (sum of the two)", {to_half.median + to_float.median, to_half.best + to_float.best,
                                           to_half.cpu_best + to_float.cpu_best});
  Row("fp16 decompress-add (float += half)", Time([&] { k.add_to_float(h.data(), y.data(), kN); }));
  k.to_half(x.data(), h2.data(), kN);
  MPI_Datatype half_type;
  MPI_Op op;
  MpiReduction(DataType::kFloat16, ReduceOp::kSum, &half_type, &op);
  Row("fp16 MPI sum op (MPI_Reduce_local)", Time([&] {
        MPI_Reduce_local(h.data(), h2.data(), static_cast<int>(kN), half_type, op);
      }));
  Row("  scalar fallback: compress", Time([&] { s.to_half(x.data(), h.data(), kN); }, 1));
  Row("  scalar fallback: decompress", Time([&] { s.to_float(h.data(), y.data(), kN); }, 1));

  for (double ratio : {0.01, 0.001}) {
    TopKCompressor topk(ratio);
    std::vector<uint8_t> wire(std::max(topk.CompressedBytes(one), topk.CompressedBytes(many)));
    char name[80];
    std::snprintf(name, sizeof(name), "top-k %g compress, 1 segment", ratio);
    Row(name, Time([&] { topk.Compress(x.data(), one, wire.data()); }));
    std::snprintf(name, sizeof(name), "top-k %g compress, 161 segments", ratio);
    Row(name, Time([&] { topk.Compress(x.data(), many, wire.data()); }));
    topk.Compress(x.data(), one, wire.data());
    std::snprintf(name, sizeof(name), "top-k %g decompress-add (1 rank's part)", ratio);
    Row(name, Time([&] { topk.DecompressAdd(wire.data(), one, y.data()); }));
    std::snprintf(name, sizeof(name), "top-k %g decompress (zero + scatter)", ratio);
    Row(name, Time([&] { topk.Decompress(wire.data(), one, y.data()); }));
    ErrorFeedback ef(std::make_unique<TopKCompressor>(ratio));
    std::snprintf(name, sizeof(name), "top-k %g + error feedback compress, 161 seg", ratio);
    Row(name, Time([&] { ef.Compress(x.data(), many, wire.data()); }));
    TopKCompressor scalar(ratio);
    scalar.set_vectorised(false);
    std::snprintf(name, sizeof(name), "  scalar pass: top-k %g compress, 1 segment", ratio);
    Row(name, Time([&] { scalar.Compress(x.data(), one, wire.data()); }, 3));
    std::printf("  (repeated passes %lld, mid-pass trims %lld)\n",
                static_cast<long long>(topk.repeated_passes()), static_cast<long long>(topk.compactions()));
  }
  {
    ErrorFeedback ef(std::make_unique<FP16Compressor>());
    std::vector<uint8_t> wire(ef.CompressedBytes(many));
    Row("fp16 + error feedback compress, 161 seg", Time([&] { ef.Compress(x.data(), many, wire.data()); }));
  }
  {
    BF16Compressor bf16;
    std::vector<uint8_t> wire(bf16.CompressedBytes(one));
    Row("bf16 compress (float -> bfloat16)", Time([&] { bf16.Compress(x.data(), one, wire.data()); }));
    Row("bf16 decompress (bfloat16 -> float)", Time([&] { bf16.Decompress(wire.data(), one, y.data()); }));
  }
  {
    // Deep Gradient Compression's top-k 0.1 %: momentum correction (with
    // masking) over error feedback over top-k, past its warm-up.
    MomentumCorrection dgc(std::make_unique<ErrorFeedback>(std::make_unique<TopKCompressor>(
                               0.001, TopKCompressor::kDefaultSampleSize, TopKCompressor::kEngineSendWholeBelow)),
                           0.9);
    std::vector<uint8_t> wire(dgc.CompressedBytes(many));
    Row("top-k 0.001 + momentum correction, 161 seg", Time([&] { dgc.Compress(x.data(), many, wire.data()); }));
  }
  {
    // PowerSGD's arithmetic on 161 near-square matrices (P = M Q, Q = M^T P,
    // P Q^T, error feedback), over a one-rank MPI wire: the allreduces cost
    // nothing here, only the compression's own work is timed.
    std::vector<Segment> mats;
    int64_t off = 0;
    for (const Segment& s0 : many) {
      const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(static_cast<double>(s0.count))));
      const int64_t c = rows * (s0.count / rows);
      mats.push_back({s0.name, off, c, rows});
      off += c;
    }
    AbortSignal never;
    MpiTransport self(MPI_COMM_SELF, WaitPolicy(), &never);
    for (int rank : {1, 4}) {
      PowerSGDCompressor psgd(rank, 0);
      std::vector<float> data(x.begin(), x.begin() + off);
      int64_t sent = 0;
      char name[80];
      std::snprintf(name, sizeof(name), "PowerSGD rank %d compute, 161 matrices", rank);
      Row(name, Time([&] { psgd.Exchange(self, data.data(), mats, &sent); }));
    }
  }
  // What an exact selection costs: nth_element over the magnitudes.
  std::vector<float> mag(kN);
  Row("  reference: exact nth_element k=1% (1 run)", Time([&] {
        for (int64_t i = 0; i < kN; ++i) mag[i] = std::fabs(x[i]);
        std::nth_element(mag.begin(), mag.begin() + kN / 100, mag.end(), std::greater<float>());
      }, 1));
  MPI_Finalize();
  return 0;
}

// Checks of csrc/allreduce/allreduce_pipeline.h and each bucket strategy, on the
// in-process fake transport (fake_transport.h): ranks are threads, and each
// rank's results are compared with a sum the test computes itself. Dense
// buckets (fused, direct, in place, widened 16-bit floats, several
// pipelined buckets), compressed buckets summed as fp16 and gathered as
// top-k, PowerSGD's exchange, compression between hosts on a 2 x 2 grid,
// the compressed reducescatter (ops/collective_ops.h), and the quantizer on
// 16-bit floats (widened around it) along each of those paths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "compressors/topk.h"
#include "fake_transport.h"
#include "kernels/half.h"
#include "allreduce/allreduce_pipeline.h"
#include "ops/collective_ops.h"

using namespace hvdlite;
using hvdlite_test::FakeGrid;
using hvdlite_test::FakeTransport;
using hvdlite_test::RunRanks;

namespace {

struct TensorSpec {
  std::string name;
  int64_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0, postscale = 1.0;
  CompressionSpec compression;
  bool in_place = false;
};

// Small integers (exact in every type, fp16 sums included); rank, tensor and
// element all change them.
double InputValue(int rank, size_t tensor, int64_t i) {
  return static_cast<double>((i * 7 + rank * 3 + static_cast<int64_t>(tensor) * 5) % 11) - 5.0;
}

void Store(uint8_t* p, DataType dtype, int64_t i, double v) {
  switch (dtype) {
    case DataType::kFloat32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: reinterpret_cast<double*>(p)[i] = v; break;
    case DataType::kInt32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DataType::kFloat16: reinterpret_cast<uint16_t*>(p)[i] = FloatToHalf(static_cast<float>(v)); break;
    case DataType::kBFloat16: reinterpret_cast<uint16_t*>(p)[i] = FloatToBFloat16(static_cast<float>(v)); break;
    default: break;
  }
}

double Load(const uint8_t* p, DataType dtype, int64_t i) {
  switch (dtype) {
    case DataType::kFloat32: return reinterpret_cast<const float*>(p)[i];
    case DataType::kFloat64: return reinterpret_cast<const double*>(p)[i];
    case DataType::kInt32: return reinterpret_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case DataType::kFloat16: return HalfToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    default: return 0;
  }
}

// One rank's engine parts and tensors.
struct Rank {
  Rank(const std::vector<TensorSpec>& specs, int rank, const EngineOptions& options)
      : ctx(options, &stats, nullptr), pipeline(&ctx) {
    for (size_t t = 0; t < specs.size(); ++t) {
      const TensorSpec& s = specs[t];
      const size_t bytes = static_cast<size_t>(s.count) * DataTypeSize(s.dtype);
      inputs.emplace_back(bytes + 1);
      outputs.emplace_back(bytes + 1);
      for (int64_t i = 0; i < s.count; ++i) Store(inputs.back().data(), s.dtype, i, InputValue(rank, t, i));
      TensorEntry e;
      e.request.rank = rank;
      e.request.name = s.name;
      e.request.dtype = s.dtype;
      e.request.shape = {s.count};
      e.request.reduce_op = s.op;
      e.request.prescale = s.prescale;
      e.request.postscale = s.postscale;
      e.request.compression = s.compression;
      e.input = inputs.back().data();
      e.output = s.in_place ? inputs.back().data() : outputs.back().data();
      e.work = std::make_shared<Work>(OpType::kAllreduce, s.name);
      entries.push_back(std::move(e));
    }
  }
  std::vector<TensorEntry*> Pointers() {
    std::vector<TensorEntry*> out;
    for (auto& e : entries) out.push_back(&e);
    return out;
  }
  Status Run(Transport& wire) { return pipeline.Run(wire, Pointers()); }
  double Result(size_t t, int64_t i) const {
    return Load(static_cast<const uint8_t*>(entries[t].output), entries[t].request.dtype, i);
  }

  EngineStats stats;
  OperationContext ctx;
  AllreducePipeline pipeline;
  std::vector<std::vector<uint8_t>> inputs, outputs;
  std::vector<TensorEntry> entries;
};

// The sum over `size` ranks of tensor t's element i, as the engine defines
// it: prescale before, postscale (and 1/size for Average) after.
double Expected(const TensorSpec& s, size_t t, int64_t i, int size) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += InputValue(r, t, i) * s.prescale;
  double post = s.postscale;
  if (s.op == ReduceOp::kAverage) post /= size;
  return sum * post;
}

EngineOptions Options(int64_t fusion, int64_t direct) {
  EngineOptions o;
  o.fusion_threshold_bytes = fusion;
  o.direct_threshold_bytes = direct;
  return o;
}

// Runs `specs` through the pipeline on `size` fake ranks and checks every
// rank's every element against Expected (within `tolerance`, relative).
// Returns rank 0's wire log.
std::vector<std::string> CheckRound(const char* what, int size, const std::vector<TensorSpec>& specs,
                                    const EngineOptions& options, double tolerance = 0.0) {
  std::vector<std::string> log0;
  std::mutex mutex;
  RunRanks(size, [&](int rank, FakeTransport& wire) {
    Rank me(specs, rank, options);
    Status s = me.Run(wire);
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(s.ok(), "%s: rank %d: %s", what, rank, s.message().c_str());
    for (size_t t = 0; t < specs.size(); ++t) {
      CHECK(me.entries[t].work->IsCompleted() && me.entries[t].work->status().ok(), "%s: %s completed", what,
            specs[t].name.c_str());
      int bad = 0;
      for (int64_t i = 0; i < specs[t].count; ++i) {
        const double want = Expected(specs[t], t, i, size), got = me.Result(t, i);
        if (std::fabs(got - want) > tolerance * std::max(1.0, std::fabs(want))) ++bad;
      }
      CHECK(bad == 0, "%s: rank %d, %s: %d of %lld elements differ from the reference", what, rank,
            specs[t].name.c_str(), bad, static_cast<long long>(specs[t].count));
    }
    if (rank == 0) log0 = wire.log();
  });
  return log0;
}

TensorSpec Tensor(const std::string& name, int64_t count, DataType dtype = DataType::kFloat32,
                  ReduceOp op = ReduceOp::kSum) {
  TensorSpec s;
  s.name = name;
  s.count = count;
  s.dtype = dtype;
  s.op = op;
  return s;
}

size_t Count(const std::vector<std::string>& log, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(log.begin(), log.end(),
                                           [&](const std::string& l) { return l.rfind(prefix, 0) == 0; }));
}

void TestDenseBucketsPipelined() {
  std::vector<TensorSpec> specs;
  for (int t = 0; t < 7; ++t) specs.push_back(Tensor("dense." + std::to_string(t), 100 + 37 * t));
  specs[2].op = ReduceOp::kAverage;
  specs[3].prescale = 0.5;
  specs[3].postscale = 4.0;
  specs[4].in_place = true;
  // 1 KiB buckets: several, each overlapping the next one's staging.
  auto log = CheckRound("fused", 3, specs, Options(1024, 1 << 20), 1e-6);
  CHECK(Count(log, "allreduce float32") >= 3, "several fused buckets (%zu calls)", log.size());
  CHECK(Count(log, "allreduce float32") == log.size(), "all allreduces of float32");
}

void TestDirectBuckets() {
  std::vector<TensorSpec> specs = {Tensor("small", 10), Tensor("big", 4096), Tensor("big.inplace", 4096),
                                   Tensor("big.scaled", 4096, DataType::kFloat32, ReduceOp::kAverage)};
  specs[2].in_place = true;
  specs[3].prescale = 2.0;
  auto log = CheckRound("direct", 4, specs, Options(1 << 20, 4096));
  CHECK(log.size() == 4, "one fused bucket and three direct ones: %zu calls", log.size());
}

void TestOtherTypesAndOps() {
  CheckRound("float64", 2, {Tensor("f64", 300, DataType::kFloat64), Tensor("f64.avg", 5, DataType::kFloat64, ReduceOp::kAverage)},
             Options(1 << 20, 1 << 20));
  CheckRound("int32", 3, {Tensor("i32", 300, DataType::kInt32)}, Options(64, 1 << 20));
  CheckRound("int64", 2, {Tensor("i64", 1000, DataType::kInt64)}, Options(1 << 20, 64));
}

void TestSixteenBitFloatsSummedAsFloat32() {
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<TensorSpec> specs = {Tensor("h.0", 500, dtype), Tensor("h.1", 3000, dtype, ReduceOp::kAverage)};
    specs[0].prescale = 0.5;
    auto log = CheckRound("16-bit", 4, specs, Options(1 << 20, 1024), 1e-2);
    CHECK(log.size() == 1 && Count(log, "allreduce float32 3500") == 1,
          "widened, fused (never direct) and summed as float32: %s", log.empty() ? "" : log[0].c_str());
  }
}

CompressionSpec Compression(CompressionType type, double ratio = 0.0) {
  CompressionSpec c;
  c.type = type;
  c.topk_ratio = ratio;
  return c;
}

void TestCompressedSummedAsWireType() {
  std::vector<TensorSpec> specs = {Tensor("c.0", 300), Tensor("c.1", 1000, DataType::kFloat32, ReduceOp::kAverage),
                                   Tensor("c.2", 77)};
  for (auto& s : specs) s.compression = Compression(CompressionType::kFP16);
  specs[2].prescale = 0.5;
  auto log = CheckRound("fp16", 4, specs, Options(2048, 0), 1e-3);
  CHECK(!log.empty() && Count(log, "allreduce float16") == log.size(), "fp16 forms summed as fp16 (%zu calls)",
        log.size());
  for (auto& s : specs) s.compression = Compression(CompressionType::kBF16);
  log = CheckRound("bf16", 3, specs, Options(1 << 20, 0), 1e-2);
  CHECK(log.size() == 1 && Count(log, "allreduce bfloat16 1377") == 1, "one bf16 bucket: %s",
        log.empty() ? "" : log[0].c_str());
}

void TestCompressedGathered() {
  // Ratio 1: every element is sent, so the sum is exact.
  std::vector<TensorSpec> specs = {Tensor("k.0", 200), Tensor("k.1", 64), Tensor("k.2", 513)};
  for (auto& s : specs) s.compression = Compression(CompressionType::kTopK, 1.0);
  specs[1].op = ReduceOp::kAverage;
  auto log = CheckRound("topk", 3, specs, Options(1 << 20, 0), 1e-6);
  CHECK(log.size() == 1 && Count(log, "allgather") == 1, "top-k forms gathered, one bucket (%zu calls)", log.size());
}

// Top-k below ratio 1: each rank sends its k largest magnitudes; the result
// is the sum of what the ranks sent.
void TestTopKSelectsLargestOnEachRank() {
  const int size = 2;
  const int64_t n = 4096;  // above the size sent whole
  const int64_t k = TopKCompressor::K(0.01, n);
  std::mutex mutex;
  RunRanks(size, [&](int rank, FakeTransport& wire) {
    TensorSpec s = Tensor("sparse", n);
    s.compression = Compression(CompressionType::kTopK, 0.01);
    Rank me({s}, rank, Options(1 << 20, 0));
    // Distinct magnitudes: rank r's largest are elements r*k .. r*k+k-1.
    auto* in = reinterpret_cast<float*>(me.inputs[0].data());
    for (int64_t i = 0; i < n; ++i) in[i] = (i / k == rank ? 100.0f : 1.0f) + 0.001f * static_cast<float>(i);
    Status st = me.Run(wire);
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(st.ok(), "topk 0.01: %s", st.message().c_str());
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = i / k < size ? 100.0f + 0.001f * static_cast<float>(i) : 0.0f;
      if (std::fabs(static_cast<float>(me.Result(0, i)) - want) > 1e-3f) ++bad;
    }
    CHECK(bad == 0, "rank %d: the sum of each rank's top %lld (%d elements differ)", rank,
          static_cast<long long>(k), bad);
  });
}

// A rank-1 matrix on every rank: PowerSGD's rank-1 approximation of the sum
// is the sum itself.
void TestExchangeBucket() {
  const int size = 2, rows = 16, cols = 24;
  std::mutex mutex;
  RunRanks(size, [&](int rank, FakeTransport& wire) {
    TensorSpec s = Tensor("matrix", rows * cols);
    s.compression = Compression(CompressionType::kPowerSGD);
    s.compression.rank = 1;
    Rank me({s}, rank, Options(1 << 20, 0));
    me.entries[0].request.shape = {rows, cols};
    auto* in = reinterpret_cast<float*>(me.inputs[0].data());
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) in[i * cols + j] = static_cast<float>((rank + 1) * (i + 1)) * (1.0f + 0.1f * j);
    }
    Status st = me.Run(wire);
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(st.ok(), "powersgd: %s", st.message().c_str());
    int bad = 0;
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        const double want = 3.0 * (i + 1) * (1.0 + 0.1 * j);
        if (std::fabs(me.Result(0, i * cols + j) - want) > 1e-3 * want) ++bad;
      }
    }
    CHECK(bad == 0, "rank %d: the rank-1 sum recovered (%d elements differ)", rank, bad);
    CHECK(Count(wire.log(), "allreduce float32") == 2, "P and Q allreduced: %zu calls", wire.log().size());
  });
}

void TestCompressedBetweenHosts() {
  for (CompressionType type : {CompressionType::kFP16, CompressionType::kTopK}) {
    FakeGrid grid(2, 2);
    std::vector<TensorSpec> specs = {Tensor("x.0", 301), Tensor("x.1", 50, DataType::kFloat32, ReduceOp::kAverage)};
    for (auto& s : specs) s.compression = Compression(type, 1.0);
    std::mutex mutex;
    grid.Run([&](int rank, FakeTransport& wire) {
      Rank me(specs, rank, Options(1 << 20, 0));
      Status s = me.Run(wire);
      std::lock_guard<std::mutex> lock(mutex);
      CHECK(s.ok(), "between hosts: %s", s.message().c_str());
      int bad = 0;
      for (size_t t = 0; t < specs.size(); ++t) {
        for (int64_t i = 0; i < specs[t].count; ++i) {
          const double want = Expected(specs[t], t, i, 4);
          if (std::fabs(me.Result(t, i) - want) > 1e-3 * std::max(1.0, std::fabs(want))) ++bad;
        }
      }
      CHECK(bad == 0, "rank %d: the sum over 2 x 2 ranks (%d elements differ)", rank, bad);
      CHECK(wire.log().empty(), "nothing on the whole set's wire");
      const auto& host = grid.host[static_cast<size_t>(rank)]->log();
      const auto& across = grid.across[static_cast<size_t>(rank)]->log();
      CHECK(Count(host, "reducescatter float32 351") == 1 && Count(host, "allgatherv") == 1,
            "exact inside the host");
      CHECK(across.size() == 1 && Count(across, type == CompressionType::kFP16 ? "allreduce float16" : "allgather") == 1,
            "compressed between hosts: %s", across.empty() ? "" : across[0].c_str());
    });
  }
}

// The compressed reducescatter takes the same recipe: each rank keeps its
// block of the sum.
void TestCompressedReducescatter() {
  const int size = 3;
  const int64_t rows = 7, cols = 5;
  for (CompressionType type : {CompressionType::kFP16, CompressionType::kTopK}) {
    std::mutex mutex;
    RunRanks(size, [&](int rank, FakeTransport& wire) {
      TensorSpec s = Tensor("rs", rows * cols);
      s.compression = Compression(type, 1.0);
      Rank me({s}, rank, Options(1 << 20, 0));
      TensorEntry& e = me.entries[0];
      e.request.op = OpType::kReducescatter;
      e.request.shape = {rows, cols};
      e.work = std::make_shared<Work>(OpType::kReducescatter, "rs");
      Response response;
      response.request = e.request;
      response.rows_per_rank = {3, 2, 2};
      Status st = RunReducescatter(me.ctx, wire, e, response);
      std::lock_guard<std::mutex> lock(mutex);
      CHECK(st.ok(), "compressed reducescatter: %s", st.message().c_str());
      const int64_t start = rank == 0 ? 0 : (rank == 1 ? 3 : 5);
      const int64_t mine = response.rows_per_rank[static_cast<size_t>(rank)] * cols;
      const auto* out = static_cast<const float*>(e.work->output.data());
      int bad = 0;
      for (int64_t i = 0; i < mine; ++i) {
        if (std::fabs(out[i] - Expected(s, 0, start * cols + i, size)) > 1e-3) ++bad;
      }
      CHECK(bad == 0 && e.work->output_shape[0] == response.rows_per_rank[static_cast<size_t>(rank)],
            "rank %d keeps its block of the sum (%d differ)", rank, bad);
      CHECK(Count(wire.log(), type == CompressionType::kFP16 ? "reducescatter float16" : "allgather") == 1,
            "the wire form crossed: %s", wire.log().empty() ? "" : wire.log()[0].c_str());
    });
  }
}

// The quantizer takes 16-bit floats: widened into its float32 input, the
// gathered sum narrowed back once, in a bucket, between hosts and in a
// reducescatter. At 8 bits each rank is within half a step (5 / 127 / 2) of
// its input, so the sums are within 0.1 (relative above 1).
CompressionSpec Quantized8() {
  CompressionSpec q = Compression(CompressionType::kQuantize);
  q.bits = 8;
  q.block_size = 64;
  return q;
}

void TestQuantizedSixteenBitFloats() {
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<TensorSpec> specs = {Tensor("q.0", 500, dtype), Tensor("q.1", 77, dtype, ReduceOp::kAverage)};
    for (auto& s : specs) s.compression = Quantized8();
    specs[0].prescale = 0.5;
    auto log = CheckRound("quantized 16-bit", 4, specs, Options(1 << 20, 0), 0.1);
    CHECK(log.size() == 1 && Count(log, "allgather") == 1, "one gathered bucket: %s", log.empty() ? "" : log[0].c_str());

    FakeGrid grid(2, 2);
    std::mutex mutex;
    grid.Run([&](int rank, FakeTransport& wire) {
      Rank me(specs, rank, Options(1 << 20, 0));
      Status s = me.Run(wire);
      std::lock_guard<std::mutex> lock(mutex);
      int bad = 0;
      for (size_t t = 0; t < specs.size(); ++t) {
        for (int64_t i = 0; i < specs[t].count; ++i) {
          const double want = Expected(specs[t], t, i, 4);
          if (std::fabs(me.Result(t, i) - want) > 0.1 * std::max(1.0, std::fabs(want))) ++bad;
        }
      }
      CHECK(s.ok() && bad == 0, "rank %d: quantized between hosts (%d elements differ)", rank, bad);
      CHECK(Count(grid.across[static_cast<size_t>(rank)]->log(), "allgather") == 1, "gathered between hosts");
    });
  }
  const int64_t rows = 6, cols = 50;
  std::mutex mutex;
  RunRanks(3, [&](int rank, FakeTransport& wire) {
    TensorSpec s = Tensor("rs.q", rows * cols, DataType::kFloat16);
    s.compression = Quantized8();
    Rank me({s}, rank, Options(1 << 20, 0));
    TensorEntry& e = me.entries[0];
    e.request.op = OpType::kReducescatter;
    e.request.shape = {rows, cols};
    e.work = std::make_shared<Work>(OpType::kReducescatter, "rs.q");
    Response response;
    response.request = e.request;
    response.rows_per_rank = {2, 2, 2};
    Status st = RunReducescatter(me.ctx, wire, e, response);
    std::lock_guard<std::mutex> lock(mutex);
    const auto* out = static_cast<const uint16_t*>(e.work->output.data());
    int bad = 0;
    for (int64_t i = 0; i < 2 * cols; ++i) {
      const double want = Expected(s, 0, 2 * rank * cols + i, 3);
      if (std::fabs(HalfToFloat(out[i]) - want) > 0.1 * std::max(1.0, std::fabs(want))) ++bad;
    }
    CHECK(st.ok() && bad == 0, "rank %d: float16 reducescatter keeps its rows (%d differ)", rank, bad);
    CHECK(e.work->output.bytes() == static_cast<size_t>(2 * cols * 2), "a float16 result: %zu bytes",
          e.work->output.bytes());
  });
}

}  // namespace

int main() {
  return hvdlite_test::RunTests({
      {"dense buckets, pipelined", TestDenseBucketsPipelined},
      {"direct buckets", TestDirectBuckets},
      {"other types and ops", TestOtherTypesAndOps},
      {"16-bit floats summed as float32", TestSixteenBitFloatsSummedAsFloat32},
      {"compressed, summed as the wire type", TestCompressedSummedAsWireType},
      {"compressed, gathered", TestCompressedGathered},
      {"top-k selects the largest on each rank", TestTopKSelectsLargestOnEachRank},
      {"exchange bucket (PowerSGD)", TestExchangeBucket},
      {"compressed between hosts", TestCompressedBetweenHosts},
      {"compressed reducescatter", TestCompressedReducescatter},
      {"quantizer on 16-bit floats: bucket, between hosts, reducescatter", TestQuantizedSixteenBitFloats},
  });
}

// The shared-memory allreduce's sum step with streaming stores, one core, on
// the engine's own kernels: per 128 KB chunk of a 16 MB float32 gradient, this
// rank's 64 KB part plus a peer's part from a slot, the result to a result slot
// and into the gradient. "scratch": ReduceSources into an in-cache scratch, then
// two StreamingCopy passes (the engine before); "one pass":
// ReduceSourcesStreaming. Twelve gradients rotate, so each is read from memory.
// Not a test (bench/results/2026-11-26-fused-streaming/README.md has its
// numbers). Built against the engine by bench/cpp.py:
//   python bench/cpp.py sum_step_bench          # prints the binary's path
//   <binary> [reps [MB per tensor]]             # defaults: 40 reps, 16 MB
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/reduce_kernels.h"
#include "kernels/streaming_copy.h"

using namespace hvdlite;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 40;
  const size_t megabytes = argc > 2 ? std::max(1, std::atoi(argv[2])) : 16;
  const size_t kTensor = megabytes << 20, kChunk = 128 << 10, kPart = kChunk / 2, kPool = 12;
  std::vector<uint8_t*> grads(kPool);
  for (auto& g : grads) {
    g = static_cast<uint8_t*>(std::aligned_alloc(64, kTensor));
    std::memset(g, 1, kTensor);
  }
  auto* peer = static_cast<uint8_t*>(std::aligned_alloc(64, kTensor / 2));   // the peer's parts
  auto* result = static_cast<uint8_t*>(std::aligned_alloc(64, kTensor / 2)); // this rank's sums
  std::memset(peer, 0, kTensor / 2);
  std::memset(result, 0, kTensor / 2);
  std::vector<uint8_t> scratch(kPart);
  std::vector<double> ms[2];
  for (int rep = 0; rep < reps; ++rep) {
    for (int way = 0; way < 2; ++way) {
      uint8_t* grad = grads[(rep * 2 + way) % kPool];
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t c = 0; c < kTensor / kChunk; ++c) {
        uint8_t* mine = grad + c * kChunk;
        std::vector<const uint8_t*> src = {mine, peer + c * kPart};
        const int64_t n = kPart / sizeof(float);
        if (way == 0) {
          ReduceSources(src, scratch.data(), n, DataType::kFloat32, ReduceOp::kSum, 0.5);
          StreamingCopy(result + c * kPart, scratch.data(), kPart);
          StreamingCopy(mine, scratch.data(), kPart);
        } else {
          ReduceSourcesStreaming(src, result + c * kPart, mine, n, DataType::kFloat32, ReduceOp::kSum, 0.5);
        }
      }
      ms[way].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (auto& v : ms) std::sort(v.begin(), v.end());
  std::printf("sum step per %zu MB tensor, median of %d: scratch %.3f ms, one pass %.3f ms\n", megabytes, reps,
              ms[0][reps / 2], ms[1][reps / 2]);
  for (auto* g : grads) std::free(g);
  std::free(peer);
  std::free(result);
}

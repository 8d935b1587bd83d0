// An in-process Transport for the C++ unit tests: N ranks are N threads of
// one program, and every collective is a rendezvous of the group's threads,
// each posting a copy of its contribution and reading everyone's. Reductions
// use the engine's kernels (reduce_kernels.h), in rank order, as the real
// wires do, so a test compares the engine's result with a sum of its own.
// StartAllreduce and StartAllgather defer the rendezvous to Wait, as a
// nonblocking MPI collective completes in Wait, so the allreduce pipeline's
// overlap runs as on MPI. Every call is logged ("allreduce float16 96"), so
// a test can check what crossed the wire. Adasum's SendRecv is not offered.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/reduce_kernels.h"
#include "transport/transport.h"

namespace hvdlite_test {

using hvdlite::DataType;
using hvdlite::ErrorKind;
using hvdlite::OpType;
using hvdlite::ReduceOp;
using hvdlite::Status;

// The meeting point of one group's threads.
class FakeGroup {
 public:
  explicit FakeGroup(int size) : size_(size), posts_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  // Every rank posts `bytes` of `data`; once all have, `read` sees every
  // post (in rank order) and the call returns when every rank has read.
  Status Meet(int rank, const void* data, size_t bytes,
              const std::function<void(const std::vector<std::vector<uint8_t>>&)>& read) {
    const auto* p = static_cast<const uint8_t*>(data);
    posts_[static_cast<size_t>(rank)].assign(p, p + bytes);
    if (!Barrier()) return Timeout();
    read(posts_);
    return Barrier() ? Status::OK() : Timeout();
  }

 private:
  // A rank that stops meeting (a failed test) must not hang the others.
  bool Barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; });
  }
  static Status Timeout() { return Status::Error(ErrorKind::kTimeout, "a fake rank did not meet in 60 s"); }

  const int size_;
  std::vector<std::vector<uint8_t>> posts_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// A collective started but not yet run: it runs in Wait.
class FakeWork : public hvdlite::TransportWork {
 public:
  explicit FakeWork(std::function<Status()> run) : run_(std::move(run)) {}
  Status Wait() override { return run_(); }

 private:
  std::function<Status()> run_;
};

class FakeTransport : public hvdlite::Transport {
 public:
  FakeTransport(std::shared_ptr<FakeGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  // Two levels, as a hierarchical wire has them (FakeGrid).
  void SetHostLevels(Transport* host, Transport* across) { levels_ = {host, across}; }
  const std::vector<std::string>& log() const { return log_; }

  bool Supports(DataType dtype, ReduceOp op) const override { return hvdlite::ElementwiseReducible(dtype, op); }
  const char* Activity(OpType op, DataType, ReduceOp) const override {
    return op == OpType::kAllgather ? "FAKE_ALLGATHER" : "FAKE_ALLREDUCE";
  }

  Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op, double scale,
                        std::unique_ptr<hvdlite::TransportWork>* work) override {
    Log("allreduce", dtype, count);
    *work = std::make_unique<FakeWork>([=] { return Reduce(send, recv, count, dtype, op, scale); });
    return Status::OK();
  }
  Status StartAllgather(const void* send, int64_t bytes, void* recv,
                        std::unique_ptr<hvdlite::TransportWork>* work) override {
    Log("allgather", DataType::kUInt8, bytes);
    *work = std::make_unique<FakeWork>([=] {
      return group_->Meet(rank_, send, static_cast<size_t>(bytes), [&](const auto& all) {
        for (size_t r = 0; r < all.size(); ++r) {
          if (bytes > 0) std::memcpy(static_cast<uint8_t*>(recv) + r * static_cast<size_t>(bytes), all[r].data(), all[r].size());
        }
      });
    });
    return Status::OK();
  }
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override {
    Log("allreduce", dtype, count);
    return Reduce(kInPlace, data, count, dtype, op, 1.0);
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    Log("broadcast", DataType::kUInt8, bytes);
    return group_->Meet(rank_, data, rank_ == root ? static_cast<size_t>(bytes) : 0, [&](const auto& all) {
      if (rank_ != root && bytes > 0) std::memcpy(data, all[static_cast<size_t>(root)].data(), static_cast<size_t>(bytes));
    });
  }
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override {
    Log("allgatherv", DataType::kUInt8, input_bytes);
    return group_->Meet(rank_, input, static_cast<size_t>(input_bytes), [&](const auto& all) {
      size_t at = 0;
      for (size_t r = 0; r < all.size(); ++r) {
        if (!all[r].empty()) std::memcpy(static_cast<uint8_t*>(output) + at, all[r].data(), all[r].size());
        at += static_cast<size_t>(bytes_per_rank[r]);
      }
    });
  }
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override {
    Log("alltoallv", DataType::kUInt8, 0);
    // A post: each destination's byte count, then the input.
    std::vector<uint8_t> post(send_bytes.size() * sizeof(int64_t));
    std::memcpy(post.data(), send_bytes.data(), post.size());
    int64_t total = 0;
    for (int64_t b : send_bytes) total += b;
    const auto* in = static_cast<const uint8_t*>(input);
    post.insert(post.end(), in, in + total);
    return group_->Meet(rank_, post.data(), post.size(), [&](const auto& all) {
      size_t at = 0;
      for (size_t r = 0; r < all.size(); ++r) {
        const auto* sizes = reinterpret_cast<const int64_t*>(all[r].data());
        size_t from = all.size() * sizeof(int64_t);
        for (int d = 0; d < rank_; ++d) from += static_cast<size_t>(sizes[d]);
        if (recv_bytes[r] > 0) std::memcpy(static_cast<uint8_t*>(output) + at, all[r].data() + from, recv_bytes[r]);
        at += static_cast<size_t>(recv_bytes[r]);
      }
    });
  }
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts, DataType dtype,
                       ReduceOp op) override {
    int64_t total = 0, start = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < rank_) start += counts[r];
      total += counts[r];
    }
    Log("reducescatter", dtype, total);
    const size_t elem = hvdlite::DataTypeSize(dtype);
    return group_->Meet(rank_, input, static_cast<size_t>(total) * elem, [&](const auto& all) {
      std::vector<const uint8_t*> src;
      for (const auto& p : all) src.push_back(p.data() + static_cast<size_t>(start) * elem);
      if (counts[static_cast<size_t>(rank_)] > 0) {
        hvdlite::ReduceSources(src, output, counts[static_cast<size_t>(rank_)], dtype, op, 1.0);
      }
    });
  }
  Status Barrier() override {
    return group_->Meet(rank_, nullptr, 0, [](const auto&) {});
  }
  Status SendRecv(const void*, int64_t, void*, int64_t, int, int) override {
    return Status::Error(ErrorKind::kInternal, "the fake transport has no SendRecv");
  }
  Status BitwiseAnd(uint64_t* words, int count) override {
    return group_->Meet(rank_, words, static_cast<size_t>(count) * sizeof(uint64_t), [&](const auto& all) {
      for (const auto& p : all) {
        for (int i = 0; i < count; ++i) words[i] &= reinterpret_cast<const uint64_t*>(p.data())[i];
      }
    });
  }
  Status GatherBytes(const std::vector<uint8_t>& mine, int root,
                     std::vector<std::vector<uint8_t>>* all) override {
    return group_->Meet(rank_, mine.data(), mine.size(), [&](const auto& posts) {
      if (rank_ == root) *all = posts;
    });
  }
  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    return group_->Meet(rank_, bytes->data(), rank_ == root ? bytes->size() : 0, [&](const auto& all) {
      if (rank_ != root) *bytes = all[static_cast<size_t>(root)];
    });
  }
  bool GetHostLevels(hvdlite::HostLevels* out) override {
    if (levels_.host == nullptr) return false;
    *out = levels_;
    return true;
  }

 private:
  Status Reduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op, double scale) {
    const void* in = send == kInPlace ? recv : send;
    return group_->Meet(rank_, in, static_cast<size_t>(count) * hvdlite::DataTypeSize(dtype), [&](const auto& all) {
      std::vector<const uint8_t*> src;
      for (const auto& p : all) src.push_back(p.data());
      if (count > 0) hvdlite::ReduceSources(src, recv, count, dtype, op, scale);
    });
  }
  void Log(const char* what, DataType dtype, int64_t n) {
    log_.push_back(std::string(what) + " " + hvdlite::DataTypeName(dtype) + " " + std::to_string(n));
  }

  std::shared_ptr<FakeGroup> group_;
  int rank_;
  hvdlite::HostLevels levels_;
  std::vector<std::string> log_;
};

// Runs `body(rank, wire)` on `size` threads, one fake rank each.
inline void RunRanks(int size, const std::function<void(int, FakeTransport&)>& body) {
  auto group = std::make_shared<FakeGroup>(size);
  std::vector<std::unique_ptr<FakeTransport>> wires;
  for (int r = 0; r < size; ++r) wires.push_back(std::make_unique<FakeTransport>(group, r));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { body(r, *wires[static_cast<size_t>(r)]); });
  for (auto& t : threads) t.join();
}

// `hosts` x `per_host` fake ranks (rank = host * per_host + local), each
// with the two levels of a hierarchical wire: its host's ranks, and the
// ranks of its local rank on every host.
struct FakeGrid {
  FakeGrid(int hosts, int per_host) {
    auto all = std::make_shared<FakeGroup>(hosts * per_host);
    std::vector<std::shared_ptr<FakeGroup>> host_groups, across_groups;
    for (int h = 0; h < hosts; ++h) host_groups.push_back(std::make_shared<FakeGroup>(per_host));
    for (int l = 0; l < per_host; ++l) across_groups.push_back(std::make_shared<FakeGroup>(hosts));
    for (int h = 0; h < hosts; ++h) {
      for (int l = 0; l < per_host; ++l) {
        world.push_back(std::make_unique<FakeTransport>(all, h * per_host + l));
        host.push_back(std::make_unique<FakeTransport>(host_groups[static_cast<size_t>(h)], l));
        across.push_back(std::make_unique<FakeTransport>(across_groups[static_cast<size_t>(l)], h));
        world.back()->SetHostLevels(host.back().get(), across.back().get());
      }
    }
  }
  void Run(const std::function<void(int, FakeTransport&)>& body) {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < world.size(); ++r) threads.emplace_back([&, r] { body(static_cast<int>(r), *world[r]); });
    for (auto& t : threads) t.join();
  }

  std::vector<std::unique_ptr<FakeTransport>> world, host, across;
};

}  // namespace hvdlite_test

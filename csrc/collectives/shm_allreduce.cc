#include "shm_allreduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>

#include "waiter.h"

namespace hvdlite {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory counters must be lock-free to work across processes");

struct ShmAllreduce::Control {
  alignas(64) std::atomic<uint64_t> published;  // last chunk this rank put in its slot
  alignas(64) std::atomic<uint64_t> consumed;   // last chunk this rank finished reading
};

namespace {

constexpr size_t kCacheLine = 64;
constexpr int kSlots = 2;  // double buffering

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Integer sums and products wrap, as MPI's do, without signed overflow.
template <typename T>
T WrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
T WrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// out = post(src[0] op src[1] op ...), in rank order, so every rank computes
// the same bits; `post` is the caller's scale (Average), folded into the last
// pass instead of a pass of its own.
template <typename T, typename F, typename Post>
void ReduceSlots(const std::vector<const uint8_t*>& src, void* out_bytes, int64_t n, F f, Post post) {
  T* __restrict out = static_cast<T*>(out_bytes);
  const T* __restrict a = reinterpret_cast<const T*>(src[0]);
  const T* __restrict b = reinterpret_cast<const T*>(src[1]);
  if (src.size() == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = post(f(a[i], b[i]));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  for (size_t k = 2; k + 1 < src.size(); ++k) {
    const T* __restrict c = reinterpret_cast<const T*>(src[k]);
    for (int64_t i = 0; i < n; ++i) out[i] = f(out[i], c[i]);
  }
  const T* __restrict last = reinterpret_cast<const T*>(src.back());
  for (int64_t i = 0; i < n; ++i) out[i] = post(f(out[i], last[i]));
}

// The same arithmetic as CopyScaled (scale.cc), so both wires give the same bits.
template <typename T>
T Scaled(T x, double factor) {
  if constexpr (std::is_same_v<T, float>) {
    return x * static_cast<float>(factor);
  } else {
    return static_cast<T>(static_cast<double>(x) * factor);
  }
}

template <typename T, typename F>
void ReduceWithScale(const std::vector<const uint8_t*>& src, void* out, int64_t n, F f, double scale) {
  if (scale == 1.0) {
    ReduceSlots<T>(src, out, n, f, [](T x) { return x; });
  } else {
    ReduceSlots<T>(src, out, n, f, [scale](T x) { return Scaled(x, scale); });
  }
}

template <typename T>
void ReduceAs(const std::vector<const uint8_t*>& src, void* out, int64_t n, ReduceOp op, double scale) {
  switch (op) {
    case ReduceOp::kMin:
      ReduceWithScale<T>(src, out, n, [](T x, T y) { return y < x ? y : x; }, scale);
      break;
    case ReduceOp::kMax:
      ReduceWithScale<T>(src, out, n, [](T x, T y) { return x < y ? y : x; }, scale);
      break;
    case ReduceOp::kProduct:
      ReduceWithScale<T>(src, out, n, [](T x, T y) { return WrapMul(x, y); }, scale);
      break;
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      ReduceWithScale<T>(src, out, n, [](T x, T y) { return WrapAdd(x, y); }, scale);
      break;
  }
}

void Reduce(const std::vector<const uint8_t*>& src, void* out, int64_t n, DataType dtype, ReduceOp op,
            double scale) {
  switch (dtype) {
    case DataType::kUInt8: ReduceAs<uint8_t>(src, out, n, op, scale); break;
    case DataType::kInt8: ReduceAs<int8_t>(src, out, n, op, scale); break;
    case DataType::kInt32: ReduceAs<int32_t>(src, out, n, op, scale); break;
    case DataType::kInt64: ReduceAs<int64_t>(src, out, n, op, scale); break;
    case DataType::kFloat32: ReduceAs<float>(src, out, n, op, scale); break;
    case DataType::kFloat64: ReduceAs<double>(src, out, n, op, scale); break;
    default: break;  // refused by Supports()
  }
}

bool AllAgree(MPI_Comm comm, bool mine) {
  int v = mine ? 1 : 0;
  if (MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, comm) != MPI_SUCCESS) return false;
  return v != 0;
}

}  // namespace

bool ShmAllreduce::Supports(DataType dtype, ReduceOp) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kFloat32:
    case DataType::kFloat64:
      return true;
    default:
      return false;
  }
}

std::unique_ptr<ShmAllreduce> ShmAllreduce::Create(MPI_Comm comm, bool want,
                                                   const EngineOptions& options,
                                                   const std::atomic<bool>* abort) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size < 2) return nullptr;
  if (!AllAgree(comm, want)) return nullptr;

  const int64_t chunk = std::max<int64_t>(4096, RoundUp(static_cast<size_t>(options.shm_chunk_bytes), kCacheLine));
  const size_t region = RoundUp(sizeof(Control), kCacheLine) + kSlots * static_cast<size_t>(chunk);
  const size_t total = region * static_cast<size_t>(size);

  // Rank 0 names and creates the segment; the name travels by MPI.
  char name[64] = {0};
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    std::snprintf(name, sizeof(name), "/hvdlite-%d-%08x", static_cast<int>(getpid()), rd());
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(total)) != 0) {
      close(fd);
      shm_unlink(name);
      fd = -1;
    }
    if (fd < 0) name[0] = '\0';
  }
  if (MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, comm) != MPI_SUCCESS) name[0] = '\0';
  if (rank != 0 && name[0] != '\0') fd = shm_open(name, O_RDWR, 0);
  void* base = MAP_FAILED;
  if (fd >= 0) {
    base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  // Also the point after which every rank has opened it: the name can go.
  const bool mapped = AllAgree(comm, base != MAP_FAILED);
  if (rank == 0 && name[0] != '\0') shm_unlink(name);
  if (!mapped) {
    if (base != MAP_FAILED) munmap(base, total);
    return nullptr;
  }
  return std::unique_ptr<ShmAllreduce>(
      new ShmAllreduce(rank, size, base, total, chunk, options.wait, abort));
}

ShmAllreduce::ShmAllreduce(int rank, int size, void* base, size_t bytes, int64_t chunk_bytes,
                           const WaitPolicy& wait, const std::atomic<bool>* abort)
    : rank_(rank),
      size_(size),
      base_(base),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      region_bytes_(RoundUp(sizeof(Control), kCacheLine) + kSlots * static_cast<size_t>(chunk_bytes)),
      wait_(wait),
      abort_(abort),
      sources_(static_cast<size_t>(size)) {}

ShmAllreduce::~ShmAllreduce() {
  // Local: a peer that died cannot make this wait.
  munmap(base_, bytes_);
}

ShmAllreduce::Control* ShmAllreduce::control(int rank) const {
  return reinterpret_cast<Control*>(static_cast<uint8_t*>(base_) + region_bytes_ * static_cast<size_t>(rank));
}

uint8_t* ShmAllreduce::slot(int rank, uint64_t seq) const {
  return static_cast<uint8_t*>(base_) + region_bytes_ * static_cast<size_t>(rank) +
         RoundUp(sizeof(Control), kCacheLine) + static_cast<size_t>(seq % kSlots) * chunk_bytes_;
}

Status ShmAllreduce::Allreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                               double scale) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t per_chunk = chunk_bytes_ / elem;
  const auto* in = static_cast<const uint8_t*>(send == MPI_IN_PLACE ? recv : send);
  auto* out = static_cast<uint8_t*>(recv);
  for (int64_t offset = 0; offset < count; offset += per_chunk) {
    const int64_t n = std::min(per_chunk, count - offset);
    const uint64_t seq = ++seq_;
    if (seq > kSlots) {
      // This slot last held chunk seq - kSlots: wait until every peer has read it.
      Status s = WaitUntil(wait_, abort_, "shared-memory allreduce", [&](Status*) {
        for (int r = 0; r < size_; ++r) {
          if (r != rank_ && control(r)->consumed.load(std::memory_order_acquire) < seq - kSlots) {
            return false;
          }
        }
        return true;
      });
      if (!s.ok()) return s;
    }
    std::memcpy(slot(rank_, seq), in + offset * elem, static_cast<size_t>(n * elem));
    control(rank_)->published.store(seq, std::memory_order_release);
    Status s = WaitUntil(wait_, abort_, "shared-memory allreduce", [&](Status*) {
      for (int r = 0; r < size_; ++r) {
        if (control(r)->published.load(std::memory_order_acquire) < seq) return false;
      }
      return true;
    });
    if (!s.ok()) return s;
    for (int r = 0; r < size_; ++r) sources_[static_cast<size_t>(r)] = slot(r, seq);
    Reduce(sources_, out + offset * elem, n, dtype, op, scale);
    control(rank_)->consumed.store(seq, std::memory_order_release);
  }
  return Status::OK();
}

}  // namespace hvdlite

#include "transport/shm/shm_collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>

#include "kernels/reduce_kernels.h"
#include "kernels/streaming_copy.h"
#include "negotiation/rank_agreement.h"
#include "transport/transport.h"


namespace hvdlite {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory counters must be lock-free to work across processes");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");

struct ShmCollectives::Header {
  alignas(64) std::atomic<uint32_t> event;     // bumped on every publish and consume
  alignas(64) std::atomic<uint32_t> sleepers;  // ranks asleep (or going to sleep) on `event`
};

struct ShmCollectives::BoardRow {
  alignas(64) std::atomic<uint64_t> round;  // the last round whose vector is in words
  // Then two vectors of board_words_ words each, alternating by round: a rank
  // can only write round r + 2 after every rank has published r + 1, that
  // is, after everyone finished reading round r.
};

struct ShmCollectives::Control {
  alignas(64) std::atomic<uint64_t> published;  // last chunk whose input parts are in this rank's slot
  alignas(64) std::atomic<uint64_t> reduced;    // last chunk whose result part is in this rank's slot
  alignas(64) std::atomic<uint64_t> consumed;   // last chunk this rank finished reading
};

namespace {

constexpr size_t kCacheLine = 64;
// Longest futex sleep between checks for an abort or HVDLITE_TIMEOUT_SECONDS
// (and a guard should a wake-up ever be missed).
constexpr int64_t kSleepSliceUs = 2000;
// Where a spin that has shrunk to nothing grows back from (AdaptSpin).
constexpr int64_t kMinSpinNs = 250;
// Board rows cover the negotiation vector of a response cache of up to
// 64 x 1024 slots; bigger caches negotiate through MPI.
constexpr int64_t kMaxBoardWords = 1 + 1024;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t BoardRowBytes(int words) {
  return RoundUp(kCacheLine + 2 * static_cast<size_t>(words) * sizeof(uint64_t), kCacheLine);
}

// A process-shared futex (no FUTEX_PRIVATE_FLAG): the word is in a segment
// mapped by several processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec ts{static_cast<time_t>(timeout_us / 1000000), static_cast<long>(timeout_us % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

bool ShmCollectives::Supports(DataType dtype, ReduceOp op) { return ElementwiseReducible(dtype, op); }

std::unique_ptr<ShmCollectives> ShmCollectives::Create(MPI_Comm comm, bool want, const ShmSetup& setup) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size < 2) return nullptr;
  if (!AllAgree(comm, want)) return nullptr;

  const int64_t chunk = std::max<int64_t>(4096, RoundUp(static_cast<size_t>(setup.options.chunk_bytes), kCacheLine));
  const int64_t slots = std::max<int64_t>(2, setup.options.slots);
  const int board_words = static_cast<int>(std::min<int64_t>(kMaxBoardWords, 1 + (setup.cache_capacity + 63) / 64));
  const size_t header = RoundUp(sizeof(Header), kCacheLine);
  const size_t board_row = BoardRowBytes(board_words);
  const size_t region = RoundUp(sizeof(Control), kCacheLine) + 2 * static_cast<size_t>(slots * chunk);
  const size_t total = header + (board_row + region) * static_cast<size_t>(size);

  // Rank 0 names and creates the segment; the name travels by MPI.
  char name[64] = {0};
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    std::snprintf(name, sizeof(name), "/hvdlite-%d-%08x", static_cast<int>(getpid()), rd());
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    // Allocated now, not on first touch: a full /dev/shm (a container's
    // 64 MB default) then means MPI carries the set instead of a SIGBUS later.
    if (fd >= 0 && posix_fallocate(fd, 0, static_cast<off_t>(total)) != 0) {
      close(fd);
      shm_unlink(name);
      fd = -1;
    }
    if (fd < 0) name[0] = '\0';
  }
  if (!ShareRootValues(comm, name, static_cast<int>(sizeof(name)), "the shared memory's name").ok()) name[0] = '\0';
  if (rank != 0 && name[0] != '\0') fd = shm_open(name, O_RDWR, 0);
  void* base = MAP_FAILED;
  if (fd >= 0) {
    // Page tables filled now: each first touch of a ring slot otherwise
    // faults in every process, which made the first calls of a job (until the
    // ring wrapped) up to 1.5x slower.
    base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
  }
  // Also the point after which every rank has opened it: the name can go.
  const bool mapped = AllAgree(comm, base != MAP_FAILED);
  if (rank == 0 && name[0] != '\0') shm_unlink(name);
  if (!mapped) {
    if (base != MAP_FAILED) munmap(base, total);
    return nullptr;
  }
  return std::unique_ptr<ShmCollectives>(
      new ShmCollectives(rank, size, base, total, chunk, slots, board_words, setup));
}

ShmCollectives::ShmCollectives(int rank, int size, void* base, size_t bytes, int64_t chunk_bytes,
                               int64_t slots, int board_words, const ShmSetup& setup)
    : rank_(rank),
      size_(size),
      base_(base),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      slots_(slots),
      region_bytes_(RoundUp(sizeof(Control), kCacheLine) + 2 * static_cast<size_t>(slots * chunk_bytes)),
      board_words_(board_words),
      wait_(setup.wait),
      spin_ns_(setup.wait.spin_us * 1000),
      abort_(setup.abort),
      stats_(setup.stats),
      sources_(static_cast<size_t>(size)),
      scratch_(static_cast<size_t>(chunk_bytes)),
      store_choice_(SlotStoreChoice::For(setup.options.streaming_stores)) {}

ShmCollectives::~ShmCollectives() { Unmap(); }

void ShmCollectives::Unmap() {
  // Local: a peer that died cannot make this wait.
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
}

ShmCollectives::Header* ShmCollectives::header() const { return static_cast<Header*>(base_); }

ShmCollectives::BoardRow* ShmCollectives::board_row(int rank) const {
  return reinterpret_cast<BoardRow*>(static_cast<uint8_t*>(base_) + RoundUp(sizeof(Header), kCacheLine) +
                                     BoardRowBytes(board_words_) * static_cast<size_t>(rank));
}

ShmCollectives::Control* ShmCollectives::control(int rank) const {
  return reinterpret_cast<Control*>(reinterpret_cast<uint8_t*>(board_row(size_)) +
                                    region_bytes_ * static_cast<size_t>(rank));
}

uint8_t* ShmCollectives::slot(int rank, uint64_t seq) const {
  return reinterpret_cast<uint8_t*>(control(rank)) + RoundUp(sizeof(Control), kCacheLine) +
         static_cast<size_t>(seq % static_cast<uint64_t>(slots_)) * 2 * chunk_bytes_;
}

uint8_t* ShmCollectives::result_slot(int rank, uint64_t seq) const { return slot(rank, seq) + chunk_bytes_; }

bool ShmCollectives::AllPublished(uint64_t seq) const {
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && control(r)->published.load(std::memory_order_acquire) < seq) return false;
  }
  return true;
}

bool ShmCollectives::AllReduced(uint64_t seq) const {
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && control(r)->reduced.load(std::memory_order_acquire) < seq) return false;
  }
  return true;
}

bool ShmCollectives::SlotFree(uint64_t seq) const {
  const uint64_t slots = static_cast<uint64_t>(slots_);
  if (seq <= slots) return true;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && control(r)->consumed.load(std::memory_order_acquire) < seq - slots) return false;
  }
  return true;
}

void ShmCollectives::Signal() {
  // Paired with Wait(): the counter was stored before this increment, and a
  // sleeper registers before it reads the counters, so either it sees the
  // new value or we see it registered (or its futex word changed under it).
  header()->event.fetch_add(1, std::memory_order_seq_cst);
  if (header()->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&header()->event);
}

template <typename Ready>
Status ShmCollectives::Wait(const char* what, Ready ready) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto spin = std::chrono::nanoseconds(spin_ns_);
  while (true) {
    if (ready()) {
      AdaptSpin(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
      return Status::OK();
    }
    const auto waited = Clock::now() - start;
    if (abort_ != nullptr && abort_->raised()) return abort_->ErrorIn(what);
    if (wait_.timeout_seconds > 0 && waited > std::chrono::duration<double>(wait_.timeout_seconds)) {
      char limit[32];
      std::snprintf(limit, sizeof(limit), "%g", wait_.timeout_seconds);
      return Status::Error(ErrorKind::kTimeout,
                           std::string(what) + " did not complete within HVDLITE_TIMEOUT_SECONDS=" + limit +
                               " s: a peer rank has probably died, hangs, or stopped calling hvdlite");
    }
    if (waited < spin) continue;
    Header* h = header();
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t event = h->event.load(std::memory_order_seq_cst);
    if (!ready()) FutexWait(&h->event, event, kSleepSliceUs);
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmCollectives::AdaptSpin(int64_t waited_ns) {
  // A spin pays when the peer is running and answers within it; when its
  // engine is not scheduled (its core busy with backward), every spin is CPU
  // taken from this rank's training thread before it sleeps anyway (5 of
  // ~21 ms of engine CPU per train step, bench/results/2026-11-26-train-step).
  // So the spin doubles (up to WAIT_SPIN_US) after a wait that a full spin
  // would have covered, and halves after one that outlasted it.
  const int64_t limit = wait_.spin_us * 1000;
  if (waited_ns > limit) {
    spin_ns_ /= 2;
  } else if (spin_ns_ < limit) {
    spin_ns_ = std::min(limit, std::max<int64_t>(2 * spin_ns_, kMinSpinNs));
  }
}

Status ShmCollectives::BitwiseAnd(uint64_t* words, int count) {
  const uint64_t round = ++and_round_;
  const size_t buffer = static_cast<size_t>(round % 2) * static_cast<size_t>(board_words_);
  auto vector = [&](int r) {
    return reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(board_row(r)) + kCacheLine) + buffer;
  };
  std::memcpy(vector(rank_), words, static_cast<size_t>(count) * sizeof(uint64_t));
  board_row(rank_)->round.store(round, std::memory_order_release);
  Signal();
  Status s = Wait("shared-memory negotiation", [&] {
    for (int r = 0; r < size_; ++r) {
      if (board_row(r)->round.load(std::memory_order_acquire) < round) return false;
    }
    return true;
  });
  if (!s.ok()) return s;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const uint64_t* theirs = vector(r);
    for (int i = 0; i < count; ++i) words[i] &= theirs[i];
  }
  return Status::OK();
}

void ShmCollectives::PartOfChunk(int64_t n, int64_t elem, int p, int64_t* lo, int64_t* hi) const {
  const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(kCacheLine) / elem);
  const int64_t each = ((n + size_ - 1) / size_ + align - 1) / align * align;
  *lo = std::min(n, each * p);
  *hi = std::min(n, each * (p + 1));
}

// Rank p owns part p of every chunk (cache-line aligned): it alone sums that
// part, in rank order, and the others copy the result, so every rank ends
// with the same bits. Chunks [0, copied) have their parts for the other
// ranks in this rank's ring, [0, reduced) have this rank's part summed,
// [0, gathered) are done. A chunk moves on as soon as the peers allow, which
// keeps it in cache; while a peer is behind, this rank copies ahead (as far
// as its ring and the peers' reading allow).
class ShmCollectives::AllreduceCall {
 public:
  AllreduceCall(ShmCollectives& shm, const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                double scale)
      : shm_(shm),
        elem_(static_cast<int64_t>(DataTypeSize(dtype))),
        per_chunk_(shm.chunk_bytes_ / elem_),
        count_(count),
        chunks_((count + per_chunk_ - 1) / per_chunk_),
        base_(shm.seq_),
        in_(static_cast<const uint8_t*>(send == Transport::kInPlace ? recv : send)),
        out_(static_cast<uint8_t*>(recv)),
        dtype_(dtype),
        op_(op),
        scale_(scale) {}

  Status Run() {
    const int64_t switches_before = shm_.store_choice_.switches();
    while (gathered_ < chunks_) {
      if (CanGather()) {
        Gather();
      } else if (CanReduce()) {
        Reduce();
      } else if (CanCopy()) {
        Copy();
      } else {
        Status s = shm_.Wait("shared-memory allreduce", [&] { return CanGather() || CanReduce() || CanCopy(); });
        if (!s.ok()) return s;
      }
    }
    shm_.seq_ = base_ + static_cast<uint64_t>(chunks_);
    shm_.stats_->Add(shm_.stats_->shm_streamed_bytes, streamed_);
    shm_.stats_->Add(shm_.stats_->shm_store_switches, shm_.store_choice_.switches() - switches_before);
    return Status::OK();
  }

 private:
  using Clock = std::chrono::steady_clock;

  uint64_t SeqOf(int64_t chunk) const { return base_ + static_cast<uint64_t>(chunk) + 1; }
  void Part(int64_t chunk, int p, int64_t* lo, int64_t* hi) const {
    shm_.PartOfChunk(std::min(per_chunk_, count_ - chunk * per_chunk_), elem_, p, lo, hi);
  }
  bool CanGather() const { return gathered_ < reduced_ && shm_.AllReduced(SeqOf(gathered_)); }
  bool CanReduce() const { return reduced_ < copied_ && shm_.AllPublished(SeqOf(reduced_)); }
  bool CanCopy() const {
    return copied_ < chunks_ && copied_ - gathered_ < shm_.slots_ && shm_.SlotFree(SeqOf(copied_));
  }
  // The steps of sampled chunks are timed for the choice of stores
  // (slot_store_choice.h); an unsampled step reads no clock.
  Clock::time_point Begin(uint64_t seq) const {
    return shm_.store_choice_.Timed(seq) ? Clock::now() : Clock::time_point();
  }
  void Record(uint64_t seq, Clock::time_point start, int64_t bytes) {
    if (start == Clock::time_point()) return;
    shm_.store_choice_.Record(
        seq, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(), bytes);
  }
  // Copies with the stores chunk seq takes, counting what it streams.
  void CopyBytes(uint64_t seq, void* dst, const void* src, size_t n) {
    if (shm_.store_choice_.For(seq) == SlotStores::kStreaming) {
      StreamingCopy(dst, src, n);
      streamed_ += static_cast<int64_t>(n);
    } else {
      std::memcpy(dst, src, n);
    }
  }
  // A counter moved: the peers learn it.
  void Publish(std::atomic<uint64_t>& counter, uint64_t seq) {
    counter.store(seq, std::memory_order_release);
    shm_.Signal();
  }

  // The other ranks' summed parts of the next chunk into the output.
  void Gather() {
    const uint64_t seq = SeqOf(gathered_);
    const auto start = Begin(seq);
    int64_t bytes = 0, lo = 0, hi = 0;
    uint8_t* dst = out_ + gathered_ * per_chunk_ * elem_;
    for (int p = 0; p < shm_.size_; ++p) {
      if (p == shm_.rank_) continue;
      Part(gathered_, p, &lo, &hi);
      const size_t n = static_cast<size_t>((hi - lo) * elem_);
      CopyBytes(seq, dst + lo * elem_, shm_.result_slot(p, seq) + lo * elem_, n);
      bytes += static_cast<int64_t>(n);
    }
    Record(seq, start, bytes);
    Publish(shm_.control(shm_.rank_)->consumed, seq);
    ++gathered_;
  }

  // This rank's part of the next chunk, summed over every rank's input.
  void Reduce() {
    const uint64_t seq = SeqOf(reduced_);
    const auto start = Begin(seq);
    int64_t lo = 0, hi = 0;
    Part(reduced_, shm_.rank_, &lo, &hi);
    const uint8_t* mine = in_ + (reduced_ * per_chunk_ + lo) * elem_;
    for (int r = 0; r < shm_.size_; ++r) {
      shm_.sources_[static_cast<size_t>(r)] = r == shm_.rank_ ? mine : shm_.slot(r, seq) + lo * elem_;
    }
    // Summed, in one pass, into this rank's output (which may be the input
    // it reads: each element is read before it is written) and the shared
    // result for the peers, with the stores the chunk takes. Streamed sums
    // of other types than float32 go through a scratch part that stays in
    // cache, streamed from there to the shared result and to the output.
    uint8_t* result = shm_.result_slot(shm_.rank_, seq) + lo * elem_;
    uint8_t* mine_out = out_ + (reduced_ * per_chunk_ + lo) * elem_;
    const size_t bytes = static_cast<size_t>((hi - lo) * elem_);
    if (shm_.store_choice_.For(seq) == SlotStores::kStreaming) {
      if (ReduceSourcesStreaming(shm_.sources_, result, mine_out, hi - lo, dtype_, op_, scale_)) {
        streamed_ += 2 * static_cast<int64_t>(bytes);
      } else {
        ReduceSources(shm_.sources_, shm_.scratch_.data(), hi - lo, dtype_, op_, scale_);
        CopyBytes(seq, result, shm_.scratch_.data(), bytes);
        CopyBytes(seq, mine_out, shm_.scratch_.data(), bytes);
      }
    } else {
      ReduceSources(shm_.sources_, result, hi - lo, dtype_, op_, scale_, mine_out);
    }
    Record(seq, start, static_cast<int64_t>(bytes));
    Publish(shm_.control(shm_.rank_)->reduced, seq);
    ++reduced_;
  }

  // The next chunk's parts for the other ranks into this rank's ring.
  void Copy() {
    const uint64_t seq = SeqOf(copied_);
    const auto start = Begin(seq);
    int64_t bytes = 0, lo = 0, hi = 0;
    const uint8_t* src = in_ + copied_ * per_chunk_ * elem_;
    for (int p = 0; p < shm_.size_; ++p) {
      if (p == shm_.rank_) continue;
      Part(copied_, p, &lo, &hi);
      const size_t n = static_cast<size_t>((hi - lo) * elem_);
      CopyBytes(seq, shm_.slot(shm_.rank_, seq) + lo * elem_, src + lo * elem_, n);
      bytes += static_cast<int64_t>(n);
    }
    Record(seq, start, bytes);
    Publish(shm_.control(shm_.rank_)->published, seq);
    ++copied_;
  }

  ShmCollectives& shm_;
  const int64_t elem_, per_chunk_, count_, chunks_;
  const uint64_t base_;
  const uint8_t* in_;
  uint8_t* out_;
  const DataType dtype_;
  const ReduceOp op_;
  const double scale_;
  int64_t copied_ = 0, reduced_ = 0, gathered_ = 0;
  int64_t streamed_ = 0;  // bytes this call wrote with streaming stores
};

Status ShmCollectives::Allreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                                 double scale) {
  return AllreduceCall(*this, send, recv, count, dtype, op, scale).Run();
}

}  // namespace hvdlite

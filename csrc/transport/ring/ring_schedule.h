// The schedule of a pipelined ring allreduce, whatever carries its bytes
// (MPI messages: ring_allreduce.h; the ring's own sockets:
// socket/socket_ring_allreduce.h).
//
// The buffer is cut into p segments; in p-1 reduce-scatter steps each rank
// passes one segment to its right neighbour and adds the one from its left,
// so each segment ends summed on one rank; in p-1 allgather steps the sums
// travel around. Every segment is cut further into chunks. Transfers are
// numbered t = step * chunks + chunk over the 2(p-1) steps; a rank sends and
// receives them in that order, and transfer t of a rank's sends is
// transfer t of its right neighbour's receives.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hvdlite {

class RingSchedule {
 public:
  RingSchedule(int rank, int size, int64_t count, int64_t chunk_elems)
      : rank_(rank), size_(size), count_(count), chunk_elems_(chunk_elems) {
    const int64_t longest = count / size + (count % size != 0);
    chunks_ = std::max<int64_t>(1, (longest + chunk_elems - 1) / chunk_elems);
    transfers_ = 2 * (size - 1) * chunks_;
    longest_chunk_ = std::min(longest, chunk_elems);
  }

  int64_t transfers() const { return transfers_; }  // each way
  int64_t longest_chunk() const { return longest_chunk_; }
  int left() const { return Mod(rank_ - 1); }
  int right() const { return Mod(rank_ + 1); }
  // Whether receive t is a copy into place (allgather) rather than a sum.
  bool Gathering(int64_t t) const { return t / chunks_ >= size_ - 1; }
  // Send t carries what receive t - chunks brought (the first step: this
  // rank's own data): it may go once `processed` receives are in place.
  bool CanSend(int64_t t, int64_t processed) const { return t < chunks_ || processed > t - chunks_; }
  // Gathering receive t writes the place that send EarlierSend(t) read: it
  // must wait until that send no longer reads it.
  int64_t EarlierSend(int64_t t) const { return t - (size_ - 1) * chunks_; }

  // The elements transfer t sends (`sending`) or receives: chunk t % chunks
  // of the segment its step passes on.
  void Range(int64_t t, bool sending, int64_t* lo, int64_t* n) const {
    const int64_t step = t / chunks_, chunk = t % chunks_;
    const int r = rank_, p = size_;
    int segment;
    if (step < p - 1) {  // reduce-scatter
      segment = Mod(sending ? r - step : r - step - 1);
    } else {             // allgather
      const int64_t a = step - (p - 1);
      segment = Mod(sending ? r + 1 - a : r - a);
    }
    int64_t begin, end;
    Segment(segment, &begin, &end);
    *lo = std::min(end, begin + chunk * chunk_elems_);
    *n = std::min(end, *lo + chunk_elems_) - *lo;
  }

 private:
  int Mod(int64_t x) const { return static_cast<int>(((x % size_) + size_) % size_); }
  // Segment s of p: elements [begin, end).
  void Segment(int s, int64_t* begin, int64_t* end) const {
    const int64_t base = count_ / size_, extra = count_ % size_;
    *begin = s * base + std::min<int64_t>(s, extra);
    *end = *begin + base + (s < extra);
  }

  int rank_, size_;
  int64_t count_, chunk_elems_;
  int64_t chunks_ = 1, transfers_ = 0, longest_chunk_ = 0;
};

}  // namespace hvdlite

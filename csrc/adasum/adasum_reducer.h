// Adasum, Horovod's adaptive summation, as an allreduce over point-to-point
// messages on one communicator. Two gradients combine as
//   adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
// (a vector with a zero norm keeps coefficient 1), so orthogonal gradients
// add and parallel ones average. Over 2^k ranks it is a binary tree, pairs of
// ranks first: with 4, adasum(adasum(g0, g1), adasum(g2, g3)).
//
// The tree runs as recursive vector halving, distance doubling: at level
// 2^j a rank swaps half of its current piece of each tensor with rank ^ 2^j,
// the group of 2^(j+1) ranks that holds the two subtrees' vectors sums the
// pieces' dot products and squared norms, and each rank combines the half it
// kept. The halves then travel back (distance halving), so every rank ends
// with the same result.
//
// Every tensor is halved on its own, not the fused buffer as one vector: a
// tensor's elements then land on the same ranks and its sums are added in
// the same order whether or not it shares a bucket, so fused and unfused
// results are bitwise identical (Horovod splits the fused buffer and keeps
// only the coefficients per tensor).
#pragma once

#include <cstdint>
#include <vector>

#include "common/common.h"
#include "allreduce/fusion_buffer.h"
#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

// Adasum's tree pairs every rank at every level.
inline bool AdasumSupportsSize(int size) { return size > 0 && (size & (size - 1)) == 0; }

// One tensor's elements in the reduction's type (float or double).
struct AdasumTensor {
  void* data = nullptr;
  int64_t count = 0;
};

class AdasumReducer {
 public:
  // Replaces every tensor, in place, with its Adasum over the ranks of `transport`
  // (a power-of-2 number of them). `type` is kFloat32 or kFloat64: callers
  // widen 16-bit floats first. Dot products and norms are summed in double.
  Status Allreduce(Transport& transport, DataType type, const std::vector<AdasumTensor>& tensors);
  // Bytes this rank sent in the last Allreduce.
  int64_t wire_bytes() const { return wire_bytes_; }

 private:
  // A tensor's piece [lo, hi), in elements.
  struct Range {
    int64_t lo = 0;
    int64_t hi = 0;
    int64_t size() const { return hi - lo; }
  };

  template <typename T>
  Status Run(Transport& transport, const std::vector<AdasumTensor>& tensors);
  template <typename T>
  void Combine(const std::vector<AdasumTensor>& tensors, const T* theirs, bool left);
  // Sends the `give` pieces of the tensors to `peer` and receives as many
  // elements as the `take` pieces hold: into those pieces when `in_place`,
  // else contiguously into `*received` (scratch). A single piece is sent or
  // received where it lies; several are packed.
  Status Swap(Transport& transport, int peer, const std::vector<AdasumTensor>& tensors,
              const std::vector<Range>& give, const std::vector<Range>& take, size_t elem,
              bool in_place, uint8_t** received);
  Status SumOverGroup(Transport& transport, int level);

  FusionBuffer scratch_;            // kSend: packed outgoing pieces; kGather: incoming
  std::vector<Range> mine_, theirs_;  // per tensor: this rank's piece, its peer's
  std::vector<std::vector<Range>> before_;  // per level: the pieces before its split
  std::vector<double> sums_, peer_sums_;    // per tensor: dot, |left|^2, |right|^2
  int64_t wire_bytes_ = 0;
};

}  // namespace hvdlite

// One bucket of the allreduce pipeline (allreduce_pipeline.h) and the
// interface of how a bucket of one kind is run: staged for the wire, put on
// it, and taken off it into the tensors' outputs. The pipeline picks a
// strategy once per bucket, when it plans the round (dense_buckets.h,
// compressed_bucket.h, exchange_buckets.h); the pipeline itself only
// overlaps the buckets and keeps the timeline and the counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "compressors/compressor.h"
#include "engine/tensor_queue.h"
#include "transport/transport.h"

namespace hvdlite {

class BucketStrategy;

struct Bucket {
  BucketStrategy* strategy = nullptr;
  Transport* wire = nullptr;
  std::vector<TensorEntry*> entries;
  std::vector<int64_t> offsets;  // elements (staged dense) or bytes (wire form)
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Compressor* compressor = nullptr;
  CompressionType compression = CompressionType::kNone;
  HostLevels levels;      // the wire's two levels, for a bucket compressed between hosts
  int slot = 0;           // which of the fusion buffers' slots it stages in
  int64_t count = 0;      // elements
  size_t wire_bytes = 0;  // per rank
  uint8_t* staged = nullptr;
  uint8_t* gathered = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  std::unique_ptr<TransportWork> work;  // the wire's part, started by Start
  const char* activity = "";            // its timeline name
};

class BucketStrategy {
 public:
  virtual ~BucketStrategy() = default;
  // Stages the bucket's tensors; `in_flight`: the previous bucket's wire
  // work, nudged between copies (MPI progresses only inside MPI calls).
  virtual Status Prepare(Bucket& b, TransportWork* in_flight) = 0;
  // The timeline's name for the bucket's wire work.
  virtual const char* Activity(const Bucket& b) const = 0;
  // Starts the wire work into b.work and counts the bytes it puts on the wire.
  virtual Status Start(Bucket& b) = 0;
  // After b.work succeeded: the results into the tensors' outputs, scaled.
  virtual void Finish(Bucket& b, TransportWork* in_flight) = 0;
};

}  // namespace hvdlite

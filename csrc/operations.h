// Turns one round's agreed responses into work on buffers: allreduces of the
// same dtype, op and compression are fused into buckets up to the fusion
// threshold and pipelined (bucket i+1 is packed while bucket i is on the
// wire); tensors at least as large as the threshold go to MPI directly, with
// no copy. Other collectives copy/scale around their MPI call and allocate
// outputs whose size depends on other ranks. Every tensor's handle is
// completed here.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/adasum.h"
#include "compressors/compressor.h"
#include "engine_options.h"
#include "engine_stats.h"
#include "fusion_buffer.h"
#include "message.h"
#include "process_set.h"
#include "status.h"
#include "timeline.h"

namespace hvdlite {

class OperationRunner {
 public:
  OperationRunner(const EngineOptions& options, EngineStats* stats, Timeline* timeline)
      : options_(options), stats_(stats), timeline_(timeline) {}

  // `responses` is the same ordered list on every rank of `set`. A non-OK
  // result means the communicator can no longer be trusted.
  Status RunAll(ProcessSet& set, const std::vector<Response>& responses);
  // Drops error-feedback residuals (hvdlite.reset_compression_state()).
  void ResetCompression();

 private:
  struct Bucket;
  Status RunOne(ProcessSet& set, const Response& response, TensorEntry& entry);
  Status RunAllreduces(ProcessSet& set, std::vector<TensorEntry*>& entries);
  // `in_flight`: the previous bucket's wire work, nudged between copies.
  Status Prepare(ProcessSet& set, Bucket& bucket, TransportWork* in_flight);
  Status Start(ProcessSet& set, Bucket& bucket);
  Status Finish(ProcessSet& set, Bucket& bucket, TransportWork* in_flight);
  // Adasum allreduces of one dtype: buckets up to the fusion threshold, each
  // one AdasumReducer run (never shared memory: it only sums).
  Status RunAdasum(ProcessSet& set, std::vector<TensorEntry*>& entries);
  Status AdasumBucket(ProcessSet& set, const std::vector<TensorEntry*>& bucket);
  // Counts the tensors of a finished bucket, ends their timeline rows and
  // completes their handles.
  void Complete(const std::vector<TensorEntry*>& entries, int64_t wire_bytes);

  Status Allreduce(ProcessSet& set, TensorEntry& entry);
  Status Allgather(ProcessSet& set, TensorEntry& entry, const Response& response);
  Status Broadcast(ProcessSet& set, TensorEntry& entry);
  Status Alltoall(ProcessSet& set, TensorEntry& entry, const Response& response);
  Status Reducescatter(ProcessSet& set, TensorEntry& entry, const Response& response);
  Status CompressedReducescatter(ProcessSet& set, TensorEntry& entry, const Response& response);

  Compressor* CompressorFor(const CompressionSpec& spec);
  // Timeline events on the rows of `entries` (names: timeline_names.h).
  void Phase(const std::vector<TensorEntry*>& entries, const char* phase, bool begin,
             const std::string& args = "");
  // Negotiation is over: the row leaves NEGOTIATE_<OP> (unless this rank has
  // joined and never submitted the tensor) and enters the operation's span,
  // waiting in QUEUE for its turn.
  void Agreed(const TensorEntry& entry, const Response& response, bool negotiated);
  // `run` as one activity on the entry's row.
  Status Timed(TensorEntry& entry, const char* activity, const std::function<Status()>& run);

  EngineOptions options_;
  EngineStats* stats_;
  Timeline* timeline_;
  FusionBuffer buffers_;
  AdasumReducer adasum_;
  // One compressor per spec, kept across rounds: error feedback carries state.
  std::map<std::string, std::unique_ptr<Compressor>> compressors_;
  std::vector<float> widened_;
  std::vector<float> widened_out_;
  std::deque<std::vector<uint8_t>> joined_scratch_;  // zeros in, results out, for a joined rank
};

}  // namespace hvdlite

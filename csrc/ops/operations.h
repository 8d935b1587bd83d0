// Turns one round's agreed responses into work: takes each tensor from the
// queue (or, on a rank that has joined, stands in for it with zeros), fails
// the ones the coordinator refused, groups allreduces that can share a
// buffer (same dtype, op and compression) for the allreduce pipeline or
// Adasum, and runs the other collectives one by one. Every tensor's handle
// is completed here or by the parts it calls.
#pragma once

#include <deque>
#include <vector>

#include "adasum/adasum_operation.h"
#include "allreduce/allreduce_pipeline.h"
#include "ops/device_jobs.h"
#include "ops/operation_context.h"
#include "process_set/process_set.h"

namespace hvdlite {

class OperationRunner {
 public:
  OperationRunner(const EngineOptions& options, EngineStats* stats, Timeline* timeline,
                  DeviceJobQueue* device_jobs)
      : ctx_(options, stats, timeline), allreduces_(&ctx_), adasum_(&ctx_), device_jobs_(device_jobs) {}

  // `responses` is the same ordered list on every rank of `set`. A non-OK
  // result means the communicator can no longer be trusted.
  Status RunAll(ProcessSet& set, const std::vector<Response>& responses);
  // The autotuner's choice; buckets planned from now on use it.
  void SetFusionThreshold(int64_t bytes) { ctx_.options.fusion_threshold_bytes = bytes; }
  // The settings agreed at init (rank 0's shared ones) replace the local ones.
  void UseOptions(const EngineOptions& options) { ctx_.options = options; }
  // Where collectives starting and finishing are recorded (flight_recorder.h).
  void SetFlightRecorder(FlightRecorder* flight) { ctx_.flight = flight; }
  // Drops error-feedback residuals (hvdlite.reset_compression_state()).
  void ResetCompression() { ctx_.compressors.Reset(); }

 private:
  // Each response's entry: from this rank's queue, or (a joined rank)
  // zero-filled stand-ins for a tensor it never submitted.
  Status Take(ProcessSet& set, const std::vector<Response>& responses, std::vector<TensorEntry>* taken);
  // A tensor the coordinator refused (its ranks' requests do not match).
  void Refuse(ProcessSet& set, TensorEntry& entry, const Response& response);
  // One group of host allreduces that can share a buffer (Adasum or the pipeline).
  Status RunAllreduces(ProcessSet& set, const std::vector<TensorEntry*>& group);
  // The collectives other than allreduce, one tensor each.
  Status RunOne(ProcessSet& set, const Response& response, TensorEntry& entry);
  // Device tensors go to the device executor: an allreduce group in jobs of
  // up to the fusion threshold, any other collective one job per tensor.
  void HandOver(ProcessSet& set, const Response& response, std::vector<TensorEntry*> entries);
  // Negotiation is over: the row leaves NEGOTIATE_<OP> (unless this rank has
  // joined and never submitted the tensor) and enters the operation's span,
  // waiting in QUEUE for its turn.
  void Agreed(const TensorEntry& entry, const Response& response, bool negotiated);
  // The flight recorder's start and end of one collective over `entries`.
  void RecordStart(const std::vector<TensorEntry*>& entries, const char* transport, int32_t set) const;
  void RecordEnd(const std::vector<TensorEntry*>& entries, const Status& s, int32_t set) const;

  OperationContext ctx_;
  AllreducePipeline allreduces_;
  AdasumOperation adasum_;
  DeviceJobQueue* device_jobs_;
  std::deque<std::vector<uint8_t>> joined_scratch_;  // zeros in, results out, for a joined rank
};

}  // namespace hvdlite

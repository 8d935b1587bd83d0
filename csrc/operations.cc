#include "operations.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "scale.h"
#include "timeline_names.h"

namespace hvdlite {

namespace {

constexpr int64_t kCopyChunkBytes = 1 << 20;  // MPI progress between chunks

bool Is16BitFloat(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

// Average is a Sum whose result is scaled by 1/size after the wire.
double PostFactor(const Request& q, int size) {
  double f = q.postscale;
  if (q.reduce_op == ReduceOp::kAverage) f /= size;
  return f;
}

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

Status OutOfMemory(const std::string& what, size_t bytes) {
  return Status::Error(ErrorKind::kInternal,
                       "could not allocate " + std::to_string(bytes) + " bytes for " + what);
}

// Only float32 tensors are compressed; fp16 compression of other float types
// sends them as they are (validation refuses top-k on them earlier).
CompressionSpec Effective(const Request& q) {
  return q.dtype == DataType::kFloat32 ? q.compression : CompressionSpec();
}

const char* WirePhase(const Compressor* c) {
  return c && c->wire() == Compressor::Wire::kAllgather ? activity::kMpiAllgather
                                                         : activity::kMpiAllreduce;
}

std::vector<Segment> One(const TensorEntry& e, int64_t count) {
  return {Segment{e.request.name, 0, count}};
}

int64_t BytesIn(const std::vector<TensorEntry*>& entries) {
  int64_t bytes = 0;
  for (auto* e : entries) {
    bytes += NumElements(e->request.shape) * static_cast<int64_t>(DataTypeSize(e->request.dtype));
  }
  return bytes;
}

}  // namespace

struct OperationRunner::Bucket {
  std::vector<TensorEntry*> entries;
  std::vector<int64_t> offsets;  // elements (staged dense) or bytes (wire form)
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Compressor* compressor = nullptr;
  bool direct = false;  // one tensor straight from its own buffers
  bool shm = false;     // reduced through shared memory, already done by Start
  bool scaled = false;  // the post-scale was applied on the way (direct buckets)
  int slot = 0;
  int64_t count = 0;     // elements
  size_t wire_bytes = 0;  // per rank
  uint8_t* staged = nullptr;
  uint8_t* gathered = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  MPI_Request request = MPI_REQUEST_NULL;
};

void OperationRunner::Phase(const std::vector<TensorEntry*>& entries, const char* phase,
                            bool begin, const std::string& args) {
  if (timeline_ == nullptr || !timeline_->active()) return;
  for (auto* e : entries) {
    if (begin) {
      timeline_->Begin(TimelineRow(e->request), phase, args);
    } else {
      timeline_->End(TimelineRow(e->request), phase, args);
    }
  }
}

void OperationRunner::Agreed(const TensorEntry& e, const Response& r, bool negotiated) {
  if (timeline_ == nullptr || !timeline_->active()) return;
  const std::string row = TimelineRow(e.request);
  if (negotiated) timeline_->End(row, NegotiatePhase(e.request));
  timeline_->Begin(row, r.kind == Response::Kind::kError ? kErrorPhase : OperationPhase(e.request));
  timeline_->Begin(row, activity::kQueue);
}

Status OperationRunner::Timed(TensorEntry& e, const char* activity,
                              const std::function<Status()>& run) {
  Phase({&e}, activity, true);
  Status s = run();
  Phase({&e}, activity, false);
  return s;
}

Compressor* OperationRunner::CompressorFor(const CompressionSpec& spec) {
  if (spec.type == CompressionType::kNone) return nullptr;
  const std::string key = spec.ToString();
  auto it = compressors_.find(key);
  if (it == compressors_.end()) it = compressors_.emplace(key, CreateCompressor(spec)).first;
  return it->second.get();
}

void OperationRunner::ResetCompression() {
  for (auto& kv : compressors_) {
    if (kv.second) kv.second->Reset();
  }
}

Status OperationRunner::RunAll(ProcessSet& set, const std::vector<Response>& responses) {
  std::vector<TensorEntry> taken(responses.size());
  joined_scratch_.clear();
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = responses[i];
    if (set.queue().Take(r.names.at(0), &taken[i])) {
      Agreed(taken[i], r, true);
      continue;
    }
    if (r.cacheable) {
      return Status::Error(ErrorKind::kInternal,
                           "negotiated tensor '" + r.names.at(0) + "' is not in this rank's queue");
    }
    // This rank has joined: it takes part with zeros and discards the result
    // (or, for an error response, only learns the name).
    set.SkipAutoName(r.op, r.names.at(0));
    TensorEntry& e = taken[i];
    e.request = r.tmpl;
    e.request.rank = set.rank();
    const size_t bytes = static_cast<size_t>(NumElements(e.request.shape)) * DataTypeSize(e.request.dtype);
    joined_scratch_.emplace_back(bytes + 64, 0);
    e.input = joined_scratch_.back().data();
    joined_scratch_.emplace_back(bytes + 64, 0);
    e.output = joined_scratch_.back().data();
    e.work = std::make_shared<Work>(r.op, r.names.at(0));
    Agreed(e, r, false);
  }
  Status fatal;
  // Allreduces that can share a buffer: same dtype, op and compression.
  std::vector<std::pair<std::string, std::vector<TensorEntry*>>> groups;
  for (size_t i = 0; i < responses.size() && fatal.ok(); ++i) {
    TensorEntry& e = taken[i];
    const Response& r = responses[i];
    if (r.kind == Response::Kind::kError) {
      Phase({&e}, activity::kQueue, false);
      Phase({&e}, kErrorPhase, false);
      e.work->Fail(Status::Error(ErrorKind::kMismatch, r.error));
      continue;
    }
    if (r.op == OpType::kAllreduce) {
      const Request& q = e.request;
      const std::string key = std::to_string(static_cast<int>(q.dtype)) + "/" +
                              std::to_string(static_cast<int>(q.reduce_op)) + "/" +
                              Effective(q).ToString();
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == key; });
      if (g == groups.end()) {
        groups.push_back({key, {}});
        g = groups.end() - 1;
      }
      g->second.push_back(&e);
      continue;
    }
    Phase({&e}, activity::kQueue, false);
    Status s = RunOne(set, r, e);
    Phase({&e}, OperationPhase(e.request), false);
    stats_->Add(stats_->tensors, 1);
    if (s.ok()) {
      e.work->Finish();
    } else {
      e.work->Fail(s);
      if (s.kind() == ErrorKind::kMpi || s.kind() == ErrorKind::kShutdown ||
          s.kind() == ErrorKind::kTimeout) {
        fatal = s;
      }
    }
  }
  for (auto& group : groups) {
    if (!fatal.ok()) break;
    fatal = group.second[0]->request.reduce_op == ReduceOp::kAdasum ? RunAdasum(set, group.second)
                                                                    : RunAllreduces(set, group.second);
  }
  if (!fatal.ok()) {
    for (auto& e : taken) {
      if (e.work) e.work->Fail(fatal);  // no-op for those already completed
    }
  }
  stats_->buffer_bytes.store(buffers_.held_bytes(), std::memory_order_relaxed);
  return fatal;
}

Status OperationRunner::RunOne(ProcessSet& set, const Response& r, TensorEntry& e) {
  switch (r.op) {
    case OpType::kAllgather: return Allgather(set, e, r);
    case OpType::kBroadcast: return Broadcast(set, e);
    case OpType::kAlltoall: return Alltoall(set, e, r);
    case OpType::kReducescatter:
      return Effective(e.request).type == CompressionType::kNone ? Reducescatter(set, e, r)
                                                                 : CompressedReducescatter(set, e, r);
    case OpType::kBarrier: return set.mpi().Barrier();
    case OpType::kJoin:
      e.work->value = r.sizes.at(0);  // the rank that joined last
      return Status::OK();
    default: return Status::Error(ErrorKind::kInternal, "unexpected operation in response");
  }
}

Status OperationRunner::RunAllreduces(ProcessSet& set, std::vector<TensorEntry*>& entries) {
  const Request& first = entries[0]->request;
  Compressor* compressor = CompressorFor(Effective(first));
  const bool widen = Is16BitFloat(first.dtype);
  const int64_t staged_elem = (compressor || widen) ? 4 : static_cast<int64_t>(DataTypeSize(first.dtype));
  // Buckets stay within one MPI call's count.
  const int64_t threshold = std::min<int64_t>(options_.fusion_threshold_bytes, int64_t{1} << 30);
  const int64_t direct = options_.direct_threshold_bytes > 0
                             ? std::min(options_.direct_threshold_bytes, threshold)
                             : threshold;

  std::vector<Bucket> buckets;
  Status status;
  auto open_bucket = [&] {
    buckets.emplace_back();
    Bucket& b = buckets.back();
    b.dtype = first.dtype;
    b.op = first.reduce_op;
    b.compressor = compressor;
    b.slot = static_cast<int>(buckets.size() - 1) % FusionBuffer::kSlots;
  };
  int64_t open_bytes = 0;
  bool open = false;
  for (TensorEntry* e : entries) {
    const int64_t count = NumElements(e->request.shape);
    int64_t bytes = count * staged_elem;
    // Top-k's wire form (value + index) is larger than the dense input at
    // high ratios; the bucket must fit one MPI call on the wire too.
    if (compressor) bytes = std::max<int64_t>(bytes, compressor->CompressedBytes(One(*e, count)));
    if (!compressor && !widen && bytes >= direct) {
      if (count > INT_MAX) {  // beyond one MPI call: the chunked path
        Phase({e}, activity::kQueue, false);
        Status s = Allreduce(set, *e);
        Phase({e}, OperationPhase(e->request), false);
        stats_->Add(stats_->tensors, 1);
        if (!s.ok()) {
          e->work->Fail(s);
          return s;
        }
        e->work->Finish();
        continue;
      }
      open_bucket();
      buckets.back().direct = true;
      buckets.back().entries.push_back(e);
      buckets.back().count = count;
      open = false;
      continue;
    }
    if (!open || (open_bytes + bytes > threshold && !buckets.back().entries.empty())) {
      open_bucket();
      open = true;
      open_bytes = 0;
    }
    buckets.back().entries.push_back(e);
    buckets.back().count += count;
    open_bytes += bytes;
  }

  for (size_t i = 0; i < buckets.size(); ++i) {
    MPI_Request* previous = i > 0 ? &buckets[i - 1].request : nullptr;
    if ((status = Prepare(set, buckets[i], previous)).ok()) status = Start(set, buckets[i]);
    if (status.ok() && i > 0) status = Finish(set, buckets[i - 1], &buckets[i].request);
    if (!status.ok()) return status;
  }
  if (!buckets.empty()) status = Finish(set, buckets.back(), nullptr);
  return status;
}

namespace {

void CopyWithProgress(const void* in, void* out, int64_t count, DataType dtype, double factor,
                      MpiCollectives& mpi, MPI_Request* in_flight) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t chunk = in_flight ? std::max<int64_t>(1, kCopyChunkBytes / elem) : count;
  for (int64_t done = 0; done < count; done += chunk) {
    const int64_t n = std::min(chunk, count - done);
    CopyScaled(static_cast<const uint8_t*>(in) + done * elem, static_cast<uint8_t*>(out) + done * elem,
               n, dtype, factor);
    if (in_flight) mpi.Progress(in_flight);
  }
}

}  // namespace

Status OperationRunner::Prepare(ProcessSet& set, Bucket& b, MPI_Request* in_flight) {
  Phase(b.entries, activity::kQueue, false);
  if (b.direct) {
    TensorEntry& e = *b.entries[0];
    const Request& q = e.request;
    if (q.prescale != 1.0 || e.input == e.output) {
      CopyScaled(e.input, e.output, b.count, q.dtype, q.prescale);
      b.send = MPI_IN_PLACE;
    } else {
      b.send = e.input;  // zero-copy: MPI reads the caller's input directly
    }
    b.recv = e.output;
    return Status::OK();
  }
  if (b.compressor == nullptr) {
    const bool widen = Is16BitFloat(b.dtype);
    const int64_t elem = widen ? 4 : static_cast<int64_t>(DataTypeSize(b.dtype));
    b.staged = buffers_.Get(FusionBuffer::kSend, b.slot, static_cast<size_t>(b.count * elem));
    if (!b.staged) return OutOfMemory("a fusion buffer", static_cast<size_t>(b.count * elem));
    Phase(b.entries, activity::kMemcpyInFusionBuffer, true);
    int64_t offset = 0;
    for (TensorEntry* e : b.entries) {
      const int64_t n = NumElements(e->request.shape);
      b.offsets.push_back(offset);
      if (widen) {
        WidenToFloat(e->input, reinterpret_cast<float*>(b.staged) + offset, n, b.dtype, e->request.prescale);
        if (in_flight) set.mpi().Progress(in_flight);
      } else {
        CopyWithProgress(e->input, b.staged + offset * elem, n, b.dtype, e->request.prescale,
                         set.mpi(), in_flight);
      }
      offset += n;
    }
    Phase(b.entries, activity::kMemcpyInFusionBuffer, false);
    b.send = MPI_IN_PLACE;
    b.recv = b.staged;
    return Status::OK();
  }
  // Compressed: each tensor is one segment, so residuals follow tensor names.
  size_t wire = 0;
  for (TensorEntry* e : b.entries) {
    wire += b.compressor->CompressedBytes(One(*e, NumElements(e->request.shape)));
  }
  b.wire_bytes = wire;
  b.staged = buffers_.Get(FusionBuffer::kSend, b.slot, wire);
  if (!b.staged) return OutOfMemory("a compression buffer", wire);
  if (b.compressor->wire() == Compressor::Wire::kAllgather) {
    b.gathered = buffers_.Get(FusionBuffer::kGather, b.slot, wire * set.size());
    if (!b.gathered) return OutOfMemory("a gather buffer", wire * set.size());
  }
  Phase(b.entries, activity::kCompress, true);
  size_t offset = 0;
  for (TensorEntry* e : b.entries) {
    const int64_t n = NumElements(e->request.shape);
    const float* src = static_cast<const float*>(e->input);
    if (e->request.prescale != 1.0) {
      widened_.resize(static_cast<size_t>(n));
      CopyScaled(src, widened_.data(), n, DataType::kFloat32, e->request.prescale);
      src = widened_.data();
    }
    b.offsets.push_back(static_cast<int64_t>(offset));
    offset += b.compressor->Compress(src, One(*e, n), b.staged + offset);
    if (in_flight) set.mpi().Progress(in_flight);
  }
  Phase(b.entries, activity::kCompress, false);
  return Status::OK();
}

Status OperationRunner::Start(ProcessSet& set, Bucket& b) {
  Status s;
  if (b.compressor == nullptr) {
    const DataType wire_type = Is16BitFloat(b.dtype) ? DataType::kFloat32 : b.dtype;
    if (set.shm() != nullptr && ShmCollectives::Supports(wire_type, b.op)) {
      // A direct tensor's Average scale rides along with the sum.
      const double post = b.direct ? PostFactor(b.entries[0]->request, set.size()) : 1.0;
      b.scaled = post != 1.0;
      s = StartShm(set, b, b.send, b.recv, wire_type, b.op, post);
    } else {
      s = set.mpi().StartAllreduce(b.send, b.recv, b.count, MpiReductionType(wire_type),
                                   MpiReduceOp(b.op), &b.request);
    }
    stats_->Add(stats_->wire_bytes_none, b.count * static_cast<int64_t>(DataTypeSize(wire_type)));
  } else if (b.compressor->wire() == Compressor::Wire::kAllreduce) {
    if (set.shm() != nullptr && b.compressor->WireType() == MPI_UINT16_T &&
        ShmCollectives::Supports(DataType::kFloat16, ReduceOp::kSum)) {
      // The halves cross shared memory, summed as the MPI op would sum them.
      s = StartShm(set, b, MPI_IN_PLACE, b.staged, DataType::kFloat16, ReduceOp::kSum, 1.0);
    } else {
      s = set.mpi().StartAllreduce(MPI_IN_PLACE, b.staged, b.count, b.compressor->WireType(),
                                   b.compressor->WireSumOp(), &b.request);
    }
    stats_->Add(stats_->wire_bytes_fp16, static_cast<int64_t>(b.wire_bytes));
  } else {
    s = set.mpi().StartAllgather(b.staged, static_cast<int64_t>(b.wire_bytes), b.gathered, &b.request);
    stats_->Add(stats_->wire_bytes_topk, static_cast<int64_t>(b.wire_bytes));
  }
  stats_->Add(stats_->collectives, 1);
  stats_->Add(stats_->bytes_in, BytesIn(b.entries));
  if (!b.shm) Phase(b.entries, WirePhase(b.compressor), true);
  return s;
}

Status OperationRunner::StartShm(ProcessSet& set, Bucket& b, const void* send, void* recv,
                                 DataType wire_type, ReduceOp op, double scale) {
  b.shm = true;
  stats_->Add(stats_->shm_collectives, 1);
  Phase(b.entries, activity::kShmAllreduce, true);
  Status s = set.shm()->Allreduce(send, recv, b.count, wire_type, op, scale);
  Phase(b.entries, activity::kShmAllreduce, false);
  return s;
}

Status OperationRunner::Finish(ProcessSet& set, Bucket& b, MPI_Request* in_flight) {
  Status s;
  if (!b.shm) {
    s = set.mpi().WaitRequest(&b.request, WirePhase(b.compressor));
    Phase(b.entries, WirePhase(b.compressor), false);
  }
  if (!s.ok()) return s;
  const int size = set.size();
  if (b.direct) {
    TensorEntry& e = *b.entries[0];
    const double post = PostFactor(e.request, size);
    if (post != 1.0 && !b.scaled) CopyScaled(e.output, e.output, b.count, b.dtype, post);
  } else if (b.compressor == nullptr) {
    Phase(b.entries, activity::kMemcpyOutFusionBuffer, true);
    const bool widen = Is16BitFloat(b.dtype);
    const int64_t elem = widen ? 4 : static_cast<int64_t>(DataTypeSize(b.dtype));
    for (size_t i = 0; i < b.entries.size(); ++i) {
      TensorEntry& e = *b.entries[i];
      const int64_t n = NumElements(e.request.shape);
      const double post = PostFactor(e.request, size);
      if (widen) {
        NarrowFromFloat(reinterpret_cast<float*>(b.staged) + b.offsets[i], e.output, n, b.dtype, post);
        if (in_flight) set.mpi().Progress(in_flight);
      } else {
        CopyWithProgress(b.staged + b.offsets[i] * elem, e.output, n, b.dtype, post, set.mpi(), in_flight);
      }
    }
    Phase(b.entries, activity::kMemcpyOutFusionBuffer, false);
  } else {
    Phase(b.entries, activity::kDecompress, true);
    for (size_t i = 0; i < b.entries.size(); ++i) {
      TensorEntry& e = *b.entries[i];
      const int64_t n = NumElements(e.request.shape);
      auto* out = static_cast<float*>(e.output);
      if (b.compressor->wire() == Compressor::Wire::kAllreduce) {
        b.compressor->Decompress(b.staged + b.offsets[i], One(e, n), out);
      } else {
        std::memset(out, 0, static_cast<size_t>(n) * sizeof(float));
        for (int r = 0; r < size; ++r) {
          b.compressor->DecompressAdd(b.gathered + static_cast<size_t>(r) * b.wire_bytes + b.offsets[i],
                                      One(e, n), out);
        }
      }
      const double post = PostFactor(e.request, size);
      if (post != 1.0) CopyScaled(out, out, n, DataType::kFloat32, post);
      if (in_flight) set.mpi().Progress(in_flight);
    }
    Phase(b.entries, activity::kDecompress, false);
  }
  Complete(b.entries, b.compressor ? static_cast<int64_t>(b.wire_bytes) : b.count * 4);
  return Status::OK();
}

void OperationRunner::Complete(const std::vector<TensorEntry*>& entries, int64_t wire_bytes) {
  const int64_t n = static_cast<int64_t>(entries.size());
  stats_->Add(stats_->tensors, n);
  if (n > 1) {
    stats_->Add(stats_->tensors_fused, n);
    stats_->Add(stats_->fused_buffers, 1);
  }
  for (auto* e : entries) {
    if (timeline_ && timeline_->active()) {
      timeline_->End(TimelineRow(e->request), OperationPhase(e->request),
                     "\"dtype\":\"" + std::string(DataTypeName(e->request.dtype)) + "\",\"shape\":\"" +
                         ShapeString(e->request.shape) + "\",\"fused\":" + std::to_string(n) +
                         ",\"wire_bytes\":" + std::to_string(wire_bytes));
    }
    e->work->Finish();
  }
}

Status OperationRunner::RunAdasum(ProcessSet& set, std::vector<TensorEntry*>& entries) {
  // Sized as the reduction holds them: 16-bit floats widened to float32.
  const DataType dtype = entries[0]->request.dtype;
  const int64_t elem = Is16BitFloat(dtype) ? 4 : static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<TensorEntry*> bucket;
  int64_t bytes = 0;
  for (TensorEntry* e : entries) {
    const int64_t tensor_bytes = NumElements(e->request.shape) * elem;
    if (!bucket.empty() && bytes + tensor_bytes > options_.fusion_threshold_bytes) {
      Status s = AdasumBucket(set, bucket);
      if (!s.ok()) return s;
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(e);
    bytes += tensor_bytes;
  }
  return bucket.empty() ? Status::OK() : AdasumBucket(set, bucket);
}

Status OperationRunner::AdasumBucket(ProcessSet& set, const std::vector<TensorEntry*>& bucket) {
  const DataType dtype = bucket[0]->request.dtype;
  const bool widen = Is16BitFloat(dtype);
  Phase(bucket, activity::kQueue, false);
  // float32 and float64 are reduced in the caller's output; 16-bit floats in
  // a float32 copy, rounded back once at the end.
  float* widened = nullptr;
  if (widen) {
    int64_t total = 0;
    for (TensorEntry* e : bucket) total += NumElements(e->request.shape);
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(total, 1)) * sizeof(float);
    widened = reinterpret_cast<float*>(buffers_.Get(FusionBuffer::kSend, 0, bytes));
    if (widened == nullptr) return OutOfMemory("an Adasum buffer", bytes);
  }
  std::vector<AdasumTensor> tensors;
  int64_t offset = 0;
  for (TensorEntry* e : bucket) {
    const Request& q = e->request;
    const int64_t n = NumElements(q.shape);
    if (widen) {
      WidenToFloat(e->input, widened + offset, n, dtype, q.prescale);
      tensors.push_back({widened + offset, n});
      offset += n;
    } else {
      CopyScaled(e->input, e->output, n, dtype, q.prescale);
      tensors.push_back({e->output, n});
    }
  }
  Phase(bucket, activity::kMpiAdasumAllreduce, true);
  Status s = adasum_.Allreduce(set.mpi(), widen ? DataType::kFloat32 : dtype, tensors);
  Phase(bucket, activity::kMpiAdasumAllreduce, false);
  stats_->Add(stats_->collectives, 1);
  stats_->Add(stats_->bytes_in, BytesIn(bucket));
  stats_->Add(stats_->wire_bytes_none, adasum_.wire_bytes());
  if (!s.ok()) return s;
  for (size_t i = 0; i < bucket.size(); ++i) {
    TensorEntry& e = *bucket[i];
    const double post = PostFactor(e.request, set.size());
    if (widen) {
      NarrowFromFloat(static_cast<const float*>(tensors[i].data), e.output, tensors[i].count, dtype, post);
    } else if (post != 1.0) {
      CopyScaled(e.output, e.output, tensors[i].count, dtype, post);
    }
  }
  Complete(bucket, adasum_.wire_bytes());
  return Status::OK();
}

Status OperationRunner::Allreduce(ProcessSet& set, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t count = NumElements(q.shape);
  const double post = PostFactor(q, set.size());
  if (count == 0) return Status::OK();
  CopyScaled(e.input, e.output, count, q.dtype, q.prescale);
  Status s = Timed(e, activity::kMpiAllreduce,
                   [&] { return set.mpi().Allreduce(e.output, count, q.dtype, q.reduce_op); });
  stats_->Add(stats_->collectives, 1);
  stats_->Add(stats_->wire_bytes_none, count * static_cast<int64_t>(DataTypeSize(q.dtype)));
  if (s.ok() && post != 1.0) CopyScaled(e.output, e.output, count, q.dtype, post);
  return s;
}

Status OperationRunner::Broadcast(ProcessSet& set, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t bytes = NumElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  if (set.rank() == q.root_rank) CopyScaled(e.input, e.output, bytes, DataType::kUInt8, 1.0);
  stats_->Add(stats_->collectives, 1);
  return Timed(e, activity::kMpiBcast, [&] { return set.mpi().Broadcast(e.output, bytes, q.root_rank); });
}

Status OperationRunner::Allgather(ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> bytes_per_rank;
  int64_t total_rows = 0;
  for (int64_t rows : response.sizes) {
    bytes_per_rank.push_back(rows * row_bytes);
    total_rows += rows;
  }
  const size_t total_bytes = static_cast<size_t>(total_rows * row_bytes);
  if (!e.work->output.Allocate(total_bytes)) return OutOfMemory("the result of '" + q.name + "'", total_bytes);
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = total_rows;
  stats_->Add(stats_->collectives, 1);
  return Timed(e, activity::kMpiAllgather, [&] {
    return set.mpi().Allgatherv(e.input, bytes_per_rank[set.rank()], e.work->output.data(), bytes_per_rank);
  });
}

Status OperationRunner::Alltoall(ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int size = set.size();
  const int me = set.rank();
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> send_bytes(size), recv_bytes(size);
  e.work->received_splits.assign(size, 0);
  int64_t recv_rows = 0;
  for (int r = 0; r < size; ++r) {
    send_bytes[r] = response.sizes[static_cast<size_t>(me) * size + r] * row_bytes;
    const int64_t rows = response.sizes[static_cast<size_t>(r) * size + me];
    e.work->received_splits[r] = rows;
    recv_bytes[r] = rows * row_bytes;
    recv_rows += rows;
  }
  const size_t total_bytes = static_cast<size_t>(recv_rows * row_bytes);
  if (!e.work->output.Allocate(total_bytes)) return OutOfMemory("the result of '" + q.name + "'", total_bytes);
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = recv_rows;
  stats_->Add(stats_->collectives, 1);
  return Timed(e, activity::kMpiAlltoall,
               [&] { return set.mpi().Alltoallv(e.input, send_bytes, e.work->output.data(), recv_bytes); });
}

Status OperationRunner::Reducescatter(ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int me = set.rank();
  const int64_t row_elems = RowElements(q.shape);
  std::vector<int64_t> counts;
  for (int64_t rows : response.sizes) counts.push_back(rows * row_elems);
  const int64_t my_count = counts[me];
  const size_t elem = DataTypeSize(q.dtype);
  if (!e.work->output.Allocate(static_cast<size_t>(my_count) * elem)) {
    return OutOfMemory("the result of '" + q.name + "'", static_cast<size_t>(my_count) * elem);
  }
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = response.sizes[me];
  const double post = PostFactor(q, set.size());
  const int64_t count = NumElements(q.shape);
  void* out = e.work->output.data();
  stats_->Add(stats_->collectives, 1);
  if (Is16BitFloat(q.dtype)) {
    widened_.resize(static_cast<size_t>(count));
    widened_out_.resize(static_cast<size_t>(my_count));
    WidenToFloat(e.input, widened_.data(), count, q.dtype, q.prescale);
    Status s = Timed(e, activity::kMpiReducescatter, [&] {
      return set.mpi().ReduceScatter(widened_.data(), widened_out_.data(), counts, DataType::kFloat32,
                                     q.reduce_op);
    });
    if (s.ok()) NarrowFromFloat(widened_out_.data(), out, my_count, q.dtype, post);
    return s;
  }
  const void* input = e.input;
  std::vector<uint8_t> scaled;
  if (q.prescale != 1.0) {
    scaled.resize(static_cast<size_t>(count) * elem);
    CopyScaled(e.input, scaled.data(), count, q.dtype, q.prescale);
    input = scaled.data();
  }
  Status s = Timed(e, activity::kMpiReducescatter,
                   [&] { return set.mpi().ReduceScatter(input, out, counts, q.dtype, q.reduce_op); });
  if (s.ok() && post != 1.0) CopyScaled(out, out, my_count, q.dtype, post);
  return s;
}

Status OperationRunner::CompressedReducescatter(ProcessSet& set, TensorEntry& e,
                                                const Response& response) {
  const Request& q = e.request;
  const int size = set.size();
  const int me = set.rank();
  Compressor* c = CompressorFor(Effective(q));
  const int64_t row_elems = RowElements(q.shape);
  const int64_t count = NumElements(q.shape);
  std::vector<int64_t> counts;
  int64_t my_start = 0;
  for (int r = 0; r < size; ++r) {
    counts.push_back(response.sizes[r] * row_elems);
    if (r < me) my_start += counts.back();
  }
  const int64_t my_count = counts[me];
  if (!e.work->output.Allocate(static_cast<size_t>(my_count) * sizeof(float))) {
    return OutOfMemory("the result of '" + q.name + "'", static_cast<size_t>(my_count) * 4);
  }
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = response.sizes[me];
  auto* out = static_cast<float*>(e.work->output.data());
  const float* src = static_cast<const float*>(e.input);
  if (q.prescale != 1.0) {
    widened_.resize(static_cast<size_t>(count));
    CopyScaled(src, widened_.data(), count, DataType::kFloat32, q.prescale);
    src = widened_.data();
  }
  const auto segs = One(e, count);
  const size_t wire = c->CompressedBytes(segs);
  uint8_t* staged = buffers_.Get(FusionBuffer::kSend, 0, wire);
  if (!staged) return OutOfMemory("a compression buffer", wire);
  c->Compress(src, segs, staged);
  Status s;
  stats_->Add(stats_->collectives, 1);
  if (c->wire() == Compressor::Wire::kAllreduce) {
    stats_->Add(stats_->wire_bytes_fp16, static_cast<int64_t>(wire));
    const size_t unit = wire / static_cast<size_t>(std::max<int64_t>(count, 1));
    uint8_t* mine = buffers_.Get(FusionBuffer::kGather, 0, static_cast<size_t>(my_count) * unit + 64);
    if (!mine) return OutOfMemory("a compression buffer", static_cast<size_t>(my_count) * unit);
    s = Timed(e, activity::kMpiReducescatter,
              [&] { return set.mpi().ReduceScatter(staged, mine, counts, c->WireType(), c->WireSumOp()); });
    if (s.ok()) c->Decompress(mine, {Segment{q.name, 0, my_count}}, out);
  } else {
    stats_->Add(stats_->wire_bytes_topk, static_cast<int64_t>(wire));
    uint8_t* gathered = buffers_.Get(FusionBuffer::kGather, 0, wire * size);
    if (!gathered) return OutOfMemory("a gather buffer", wire * size);
    s = Timed(e, activity::kMpiAllgather, [&] {
      MPI_Request req = MPI_REQUEST_NULL;
      Status started = set.mpi().StartAllgather(staged, static_cast<int64_t>(wire), gathered, &req);
      return started.ok() ? set.mpi().WaitRequest(&req, activity::kMpiAllgather) : started;
    });
    if (s.ok()) {
      widened_out_.assign(static_cast<size_t>(count), 0.0f);
      for (int r = 0; r < size; ++r) c->DecompressAdd(gathered + static_cast<size_t>(r) * wire, segs, widened_out_.data());
      std::memcpy(out, widened_out_.data() + my_start, static_cast<size_t>(my_count) * sizeof(float));
    }
  }
  const double post = PostFactor(q, size);
  if (s.ok() && post != 1.0) CopyScaled(out, out, my_count, DataType::kFloat32, post);
  return s;
}

}  // namespace hvdlite

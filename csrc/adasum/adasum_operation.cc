#include "adasum/adasum_operation.h"

#include <algorithm>

#include "allreduce/bucket_planner.h"
#include "kernels/scale.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

Status AdasumOperation::Run(ProcessSet& set, const std::vector<TensorEntry*>& entries) {
  // Sized as the reduction holds them: 16-bit floats widened to float32.
  const DataType dtype = entries[0]->request.dtype;
  const int64_t elem = Is16BitFloat(dtype) ? 4 : static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<PlanItem> items;
  for (TensorEntry* e : entries) {
    const int64_t n = NumElements(e->request.shape);
    items.push_back(PlanItem{n, n * elem});
  }
  BucketLimits limits;
  limits.fusion_threshold_bytes = ctx_->options.fusion_threshold_bytes;
  for (const BucketPlan& plan : PlanBuckets(items, /*may_go_direct=*/false, limits)) {
    std::vector<TensorEntry*> bucket;
    for (size_t i : plan.items) bucket.push_back(entries[i]);
    Status s = RunBucket(set, bucket);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status AdasumOperation::RunBucket(ProcessSet& set, const std::vector<TensorEntry*>& bucket) {
  const DataType dtype = bucket[0]->request.dtype;
  const bool widen = Is16BitFloat(dtype);
  ctx_->Phase(bucket, activity::kQueue, false);
  // float32 and float64 are reduced in the caller's output; 16-bit floats in
  // a float32 copy, rounded back once at the end.
  float* widened = nullptr;
  if (widen) {
    int64_t total = 0;
    for (TensorEntry* e : bucket) total += NumElements(e->request.shape);
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(total, 1)) * sizeof(float);
    widened = reinterpret_cast<float*>(ctx_->buffers.Get(FusionBuffer::kSend, 0, bytes));
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
  const char* wire_activity = set.transport().Activity(OpType::kAllreduce, dtype, ReduceOp::kAdasum);
  ctx_->Phase(bucket, wire_activity, true);
  Status s = reducer_.Allreduce(set.transport(), widen ? DataType::kFloat32 : dtype, tensors);
  ctx_->Phase(bucket, wire_activity, false);
  EngineStats* stats = ctx_->stats;
  stats->Add(stats->collectives, 1);
  stats->Add(stats->bytes_in, BytesIn(bucket));
  stats->Add(WireBytes(stats, CompressionType::kNone), reducer_.wire_bytes());
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
  ctx_->CompleteAllreduces(bucket, reducer_.wire_bytes());
  return Status::OK();
}

}  // namespace hvdlite

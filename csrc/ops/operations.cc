#include "ops/operations.h"

#include <algorithm>
#include <string>

#include "ops/collective_ops.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

void OperationRunner::Agreed(const TensorEntry& e, const Response& r, bool negotiated) {
  if (ctx_.timeline == nullptr || !ctx_.timeline->active()) return;
  const std::string row = TimelineRow(e.request);
  if (negotiated) ctx_.timeline->End(row, NegotiatePhase(e.request));
  ctx_.timeline->Begin(row, r.kind == Response::Kind::kError ? kErrorPhase : OperationPhase(e.request));
  ctx_.timeline->Begin(row, activity::kQueue);
}

void OperationRunner::RecordStart(const std::vector<TensorEntry*>& entries, const char* transport,
                                  int32_t set) const {
  if (ctx_.flight == nullptr || !ctx_.flight->enabled()) return;
  const Request& q = entries[0]->request;
  FlightNote n(FlightEventKind::kCollectiveStart);
  n.name = &q.name;  // the bucket's first tensor; count says how many it fused
  n.op = static_cast<int>(q.op);
  n.dtype = static_cast<int>(q.dtype);
  n.bytes = BytesIn(entries);
  n.count = static_cast<int32_t>(entries.size());
  n.process_set = set;
  n.detail = transport;
  ctx_.flight->Record(n);
}

void OperationRunner::RecordEnd(const std::vector<TensorEntry*>& entries, const Status& s, int32_t set) const {
  if (ctx_.flight == nullptr || !ctx_.flight->enabled()) return;
  const Request& q = entries[0]->request;
  FlightNote n(FlightEventKind::kCollectiveEnd);
  n.name = &q.name;
  n.op = static_cast<int>(q.op);
  n.count = static_cast<int32_t>(entries.size());
  n.process_set = set;
  n.flag = s.ok() ? 0 : 1;
  n.detail = s.ok() ? nullptr : s.message().c_str();
  ctx_.flight->Record(n);
}

Status OperationRunner::Take(ProcessSet& set, const std::vector<Response>& responses,
                             std::vector<TensorEntry>* taken) {
  taken->assign(responses.size(), TensorEntry());
  joined_scratch_.clear();
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = responses[i];
    TensorEntry& e = (*taken)[i];
    if (set.queue().Take(r.name(), &e)) {
      Agreed(e, r, true);
      continue;
    }
    if (r.cacheable) {
      return Status::Error(ErrorKind::kInternal,
                           "negotiated tensor '" + r.name() + "' is not in this rank's queue");
    }
    // This rank has joined: it takes part with zeros and discards the result
    // (or, for an error response, only learns the name).
    if (r.request.auto_named) set.SkipAutoName(r.op(), r.name());
    e.request = r.request;
    e.request.rank = set.rank();
    e.work = std::make_shared<Work>(r.op(), r.name());
    if (r.request.device) {  // the executor makes the zeros on its device (token 0)
      Agreed(e, r, false);
      continue;
    }
    const size_t bytes = static_cast<size_t>(NumElements(e.request.shape)) * DataTypeSize(e.request.dtype);
    joined_scratch_.emplace_back(bytes + 64, 0);
    e.input = joined_scratch_.back().data();
    joined_scratch_.emplace_back(bytes + 64, 0);
    e.output = joined_scratch_.back().data();
    Agreed(e, r, false);
  }
  return Status::OK();
}

void OperationRunner::Refuse(ProcessSet& set, TensorEntry& e, const Response& r) {
  ctx_.Phase({&e}, activity::kQueue, false);
  ctx_.Phase({&e}, kErrorPhase, false);
  e.work->Fail(Status::Error(ErrorKind::kMismatch, r.error));
  if (ctx_.flight) {
    FlightNote n(FlightEventKind::kError);
    n.name = &r.name();
    n.op = static_cast<int>(r.op());
    n.process_set = set.id();
    n.detail = r.error.c_str();
    ctx_.flight->Record(n);
  }
}

Status OperationRunner::RunAllreduces(ProcessSet& set, const std::vector<TensorEntry*>& group) {
  const Request& q = group[0]->request;
  const bool adasum = q.reduce_op == ReduceOp::kAdasum;
  RecordStart(group, adasum ? "ADASUM" : set.transport().Activity(OpType::kAllreduce, q.dtype, q.reduce_op), set.id());
  Status s = adasum ? adasum_.Run(set, group) : allreduces_.Run(set.transport(), group);
  if (!s.ok()) RecordEnd(group, s, set.id());  // each bucket that finished recorded its end (CompleteAllreduces)
  return s;
}

Status OperationRunner::RunAll(ProcessSet& set, const std::vector<Response>& responses) {
  std::vector<TensorEntry> taken;
  Status fatal = Take(set, responses, &taken);  // on failure, fails what it took (below)
  // Allreduces that can share a buffer: same dtype, op and compression (and
  // the same memory: host groups run here, device groups on the executor).
  std::vector<std::pair<std::string, std::vector<TensorEntry*>>> groups;
  for (size_t i = 0; i < responses.size() && fatal.ok(); ++i) {
    TensorEntry& e = taken[i];
    const Response& r = responses[i];
    if (r.kind == Response::Kind::kError) {
      Refuse(set, e, r);
      continue;
    }
    if (e.request.device && r.op() != OpType::kAllreduce) {
      HandOver(set, r, {&e});
      continue;
    }
    if (r.op() == OpType::kAllreduce) {
      const Request& q = e.request;
      const std::string key = std::string(q.device ? "device/" : "") + std::to_string(static_cast<int>(q.dtype)) + "/" +
                              std::to_string(static_cast<int>(q.reduce_op)) + "/" +
                              EffectiveCompression(q).ToString();
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == key; });
      if (g == groups.end()) {
        groups.push_back({key, {}});
        g = groups.end() - 1;
      }
      g->second.push_back(&e);
      continue;
    }
    ctx_.Phase({&e}, activity::kQueue, false);
    RecordStart({&e}, set.transport().Activity(r.op(), e.request.dtype, e.request.reduce_op), set.id());
    Status s = RunOne(set, r, e);
    RecordEnd({&e}, s, set.id());
    ctx_.Phase({&e}, OperationPhase(e.request), false);
    ctx_.stats->Add(ctx_.stats->tensors, 1);
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
    if (group.second[0]->request.device) {
      Response agreed;  // an allreduce needs nothing beyond the requests
      agreed.request = group.second[0]->request;
      HandOver(set, agreed, group.second);
      continue;
    }
    fatal = RunAllreduces(set, group.second);
  }
  if (!fatal.ok()) {
    for (auto& e : taken) {
      if (e.work) e.work->Fail(fatal);  // no-op for those already completed
    }
  }
  ctx_.stats->buffer_bytes.store(ctx_.buffers.held_bytes(), std::memory_order_relaxed);
  return fatal;
}

void OperationRunner::HandOver(ProcessSet& set, const Response& response, std::vector<TensorEntry*> entries) {
  size_t begin = 0;
  while (begin < entries.size()) {
    // An allreduce job holds tensors up to the fusion threshold (at least one).
    size_t end = begin + 1;
    int64_t bytes = BytesIn({entries[begin]});
    while (response.op() == OpType::kAllreduce && end < entries.size()) {
      const int64_t more = BytesIn({entries[end]});
      if (bytes + more > ctx_.options.fusion_threshold_bytes) break;
      bytes += more;
      ++end;
    }
    DeviceJob job;
    job.process_set = set.id();
    job.set_rank = set.rank();
    job.set_size = set.size();
    job.response = response;
    for (size_t i = begin; i < end; ++i) {
      ctx_.Phase({entries[i]}, activity::kQueue, false);
      job.entries.push_back(std::move(*entries[i]));
      entries[i]->work.reset();  // the job owns it now
    }
    ctx_.stats->Add(ctx_.stats->tensors, static_cast<int64_t>(end - begin));
    if (end - begin > 1) {
      ctx_.stats->Add(ctx_.stats->tensors_fused, static_cast<int64_t>(end - begin));
      ctx_.stats->Add(ctx_.stats->fused_buffers, 1);
    }
    device_jobs_->Push(std::move(job));
    begin = end;
  }
}

Status OperationRunner::RunOne(ProcessSet& set, const Response& r, TensorEntry& e) {
  switch (r.op()) {
    case OpType::kAllgather: return RunAllgather(ctx_, set.transport(), e, r);
    case OpType::kBroadcast: return RunBroadcast(ctx_, set.transport(), e);
    case OpType::kAlltoall: return RunAlltoall(ctx_, set.transport(), e, r);
    case OpType::kReducescatter: return RunReducescatter(ctx_, set.transport(), e, r);
    case OpType::kBarrier: return set.transport().Barrier();
    case OpType::kJoin:
      e.work->value = r.last_joined_rank;
      return Status::OK();
    default: return Status::Error(ErrorKind::kInternal, "unexpected operation in response");
  }
}

}  // namespace hvdlite

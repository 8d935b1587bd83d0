#include "operations.h"

#include <algorithm>
#include <string>

#include "collective_ops.h"
#include "timeline_names.h"

namespace hvdlite {

void OperationRunner::Agreed(const TensorEntry& e, const Response& r, bool negotiated) {
  if (ctx_.timeline == nullptr || !ctx_.timeline->active()) return;
  const std::string row = TimelineRow(e.request);
  if (negotiated) ctx_.timeline->End(row, NegotiatePhase(e.request));
  ctx_.timeline->Begin(row, r.kind == Response::Kind::kError ? kErrorPhase : OperationPhase(e.request));
  ctx_.timeline->Begin(row, activity::kQueue);
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
    const size_t bytes = static_cast<size_t>(NumElements(e.request.shape)) * DataTypeSize(e.request.dtype);
    joined_scratch_.emplace_back(bytes + 64, 0);
    e.input = joined_scratch_.back().data();
    joined_scratch_.emplace_back(bytes + 64, 0);
    e.output = joined_scratch_.back().data();
    e.work = std::make_shared<Work>(r.op(), r.name());
    Agreed(e, r, false);
  }
  return Status::OK();
}

Status OperationRunner::RunAll(ProcessSet& set, const std::vector<Response>& responses) {
  std::vector<TensorEntry> taken;
  Status fatal = Take(set, responses, &taken);  // on failure, fails what it took (below)
  // Allreduces that can share a buffer: same dtype, op and compression.
  std::vector<std::pair<std::string, std::vector<TensorEntry*>>> groups;
  for (size_t i = 0; i < responses.size() && fatal.ok(); ++i) {
    TensorEntry& e = taken[i];
    const Response& r = responses[i];
    if (r.kind == Response::Kind::kError) {
      ctx_.Phase({&e}, activity::kQueue, false);
      ctx_.Phase({&e}, kErrorPhase, false);
      e.work->Fail(Status::Error(ErrorKind::kMismatch, r.error));
      continue;
    }
    if (r.op() == OpType::kAllreduce) {
      const Request& q = e.request;
      const std::string key = std::to_string(static_cast<int>(q.dtype)) + "/" +
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
    Status s = RunOne(set, r, e);
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
    fatal = group.second[0]->request.reduce_op == ReduceOp::kAdasum ? adasum_.Run(set, group.second)
                                                                    : allreduces_.Run(set, group.second);
  }
  if (!fatal.ok()) {
    for (auto& e : taken) {
      if (e.work) e.work->Fail(fatal);  // no-op for those already completed
    }
  }
  ctx_.stats->buffer_bytes.store(ctx_.buffers.held_bytes(), std::memory_order_relaxed);
  return fatal;
}

Status OperationRunner::RunOne(ProcessSet& set, const Response& r, TensorEntry& e) {
  switch (r.op()) {
    case OpType::kAllgather: return RunAllgather(ctx_, set, e, r);
    case OpType::kBroadcast: return RunBroadcast(ctx_, set, e);
    case OpType::kAlltoall: return RunAlltoall(ctx_, set, e, r);
    case OpType::kReducescatter: return RunReducescatter(ctx_, set, e, r);
    case OpType::kBarrier: return set.transport().Barrier();
    case OpType::kJoin:
      e.work->value = r.last_joined_rank;
      return Status::OK();
    default: return Status::Error(ErrorKind::kInternal, "unexpected operation in response");
  }
}

}  // namespace hvdlite

#include "negotiation/controller.h"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "negotiation/op_rules.h"
#include "negotiation/request_agreement.h"

namespace hvdlite {

namespace {

constexpr int kCoordinator = 0;
// Word 0 of the negotiation vector. Bits mean "this rank is quiet"; the
// bitwise AND over ranks is then "every rank is quiet".
constexpr uint64_t kQuietBit = 1;
// ...and "this rank has nothing in flight at all"; ANDed: the set is idle.
constexpr uint64_t kIdleBit = 2;

bool IsMember(const std::vector<int32_t>& ranks, int r) {
  return std::binary_search(ranks.begin(), ranks.end(), static_cast<int32_t>(r));
}

// A members-only add is decided without the other ranks, so a submission
// that cannot belong with the first (another set, another kind of request
// under its name, a rank outside the set) would otherwise wait for members
// who never come: it is decided at once, as an error (Decide says which).
bool Conflicts(const Request& first, const Request& q, int rank) {
  if (!first.members_only && !q.members_only) return false;
  return q.op != first.op || q.members_only != first.members_only || q.set_ranks != first.set_ranks ||
         !IsMember(q.set_ranks, rank);
}

}  // namespace

Controller::Controller(Transport* transport, const EngineOptions& options, EngineStats* stats)
    : transport_(transport),
      options_(options),
      stats_(stats),
      cache_(options.cache_capacity),
      last_stall_check_(Clock::now()) {}

Status Controller::Negotiate(std::vector<Request> new_requests, bool shutdown,
                             const std::string& shutdown_reason, ResponseList* out) {
  *out = ResponseList();
  ++tick_;
  RequestList mine = Sort(std::move(new_requests), Clock::now());
  mine.shutdown = shutdown;
  mine.shutdown_reason = shutdown_reason;
  if (transport_->rank() == kCoordinator && stall_shutdown_.empty()) stall_shutdown_ = InspectStalls();
  bool quiet = false;
  Status s = AgreeOnCached(mine, out, &quiet);
  if (!s.ok() || quiet) return s;
  ResponseList slow;
  s = AskCoordinator(mine, &slow);
  if (s.ok()) Learn(std::move(slow), out);
  return s;
}

RequestList Controller::Sort(std::vector<Request> new_requests, Clock::time_point now) {
  RequestList mine;
  mine.requests.swap(retry_);
  for (auto& q : new_requests) {
    if (q.op == OpType::kJoin) {
      mine.requests.push_back(std::move(q));
      continue;
    }
    const int slot = cache_.Lookup(q);
    if (slot >= 0 && !cached_waiting_.count(slot)) {
      cached_waiting_[slot] = CachedWait{std::move(q), now};
    } else {
      mine.requests.push_back(std::move(q));
    }
  }
  // A cached tensor that other ranks do not submit would wait silently; after
  // a while it goes to the coordinator, whose stall inspector can name the
  // missing ranks (this also drops the slot everywhere).
  double demote_after = 0;
  if (options_.stall_check_enabled && options_.stall_check_seconds > 0) {
    demote_after = options_.stall_check_seconds / 2;
  }
  if (options_.stall_shutdown_seconds > 0) {
    const double half = options_.stall_shutdown_seconds / 2;
    demote_after = demote_after > 0 ? std::min(demote_after, half) : half;
  }
  if (demote_after > 0) {
    for (auto it = cached_waiting_.begin(); it != cached_waiting_.end();) {
      if (std::chrono::duration<double>(now - it->second.since).count() > demote_after) {
        mine.requests.push_back(std::move(it->second.request));
        it = cached_waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return mine;
}

Status Controller::AgreeOnCached(const RequestList& mine, ResponseList* out, bool* quiet) {
  const bool my_quiet = mine.requests.empty() && !mine.shutdown && stall_shutdown_.empty();
  const int slots = cache_.num_slots();
  std::vector<uint64_t> bits(1 + (slots + 63) / 64, 0);
  const bool idle = my_quiet && cached_waiting_.empty() && sent_.empty() && retry_.empty();
  bits[0] = (my_quiet ? kQuietBit : 0) | (idle ? kIdleBit : 0);
  for (const auto& kv : cached_waiting_) bits[1 + kv.first / 64] |= uint64_t{1} << (kv.first % 64);
  Status s = transport_->BitwiseAnd(bits.data(), static_cast<int>(bits.size()));
  if (!s.ok()) return s;
  stats_->Add(stats_->cycles, 1);
  // Slots ready on every rank run first, in slot order: the same on all ranks.
  for (int slot = 0; slot < slots; ++slot) {
    if (!(bits[1 + slot / 64] & (uint64_t{1} << (slot % 64)))) continue;
    out->responses.push_back(cache_.response(slot));
    out->responses.back().from_cache = true;
    cache_.Touch(slot, tick_);
    cached_waiting_.erase(slot);
    stats_->Add(stats_->cache_hits, 1);
  }
  out->idle = (bits[0] & kIdleBit) != 0;
  *quiet = (bits[0] & kQuietBit) != 0;
  return Status::OK();
}

Status Controller::AskCoordinator(const RequestList& mine, ResponseList* slow) {
  for (const auto& q : mine.requests) sent_[q.name] = q;
  std::vector<std::vector<uint8_t>> gathered;
  Status s = transport_->GatherBytes(Serialize(mine), kCoordinator, &gathered);
  if (!s.ok()) return s;
  std::vector<uint8_t> reply;
  if (transport_->rank() == kCoordinator) {
    std::vector<RequestList> all;
    all.reserve(gathered.size());
    for (const auto& bytes : gathered) all.push_back(DeserializeRequestList(bytes.data(), bytes.size()));
    reply = Serialize(Coordinate(all));
  }
  s = transport_->BroadcastBytes(&reply, kCoordinator);
  if (!s.ok()) return s;
  *slow = DeserializeResponseList(reply.data(), reply.size());
  stats_->Add(stats_->negotiations, 1);
  return Status::OK();
}

void Controller::Learn(ResponseList slow, ResponseList* out) {
  for (const auto& name : slow.invalidated) ForgetCached(name);
  for (auto& response : slow.responses) {
    auto mine_it = sent_.find(response.name());
    const OpType op = response.op();
    // Unnamed tensors get a fresh name per call: caching them only evicts others.
    const bool cacheable = response.kind == Response::Kind::kCollective && response.cacheable &&
                           !response.request.auto_named && op != OpType::kJoin &&
                           op != OpType::kBarrier && op != OpType::kAddProcessSet &&
                           op != OpType::kRemoveProcessSet && mine_it != sent_.end();
    if (cacheable && cache_.enabled()) {
      std::string evicted;
      const int slot = cache_.Put(response, mine_it->second, tick_, &evicted);
      // The new entry took the evicted one's slot: a request still waiting on
      // that slot belongs to the evicted name and must be renegotiated.
      auto waiting = cached_waiting_.find(slot);
      if (!evicted.empty() && waiting != cached_waiting_.end()) {
        retry_.push_back(std::move(waiting->second.request));
        cached_waiting_.erase(waiting);
      }
      stats_->Add(stats_->cache_misses, 1);
    }
    if (mine_it != sent_.end()) sent_.erase(mine_it);
    out->responses.push_back(std::move(response));
  }
  out->shutdown = slow.shutdown;
  out->shutdown_ranks = std::move(slow.shutdown_ranks);
  out->shutdown_reasons = std::move(slow.shutdown_reasons);
  out->stall_error = std::move(slow.stall_error);
}

void Controller::ForgetCached(const std::string& name) {
  const int slot = cache_.SlotOf(name);
  if (slot < 0) return;
  auto it = cached_waiting_.find(slot);
  if (it != cached_waiting_.end()) {
    retry_.push_back(std::move(it->second.request));
    cached_waiting_.erase(it);
  }
  cache_.Erase(name);
}

namespace {

std::string Metadata(const Request& r) {
  return std::string(OpTypeName(r.op)) + ", " + DataTypeName(r.dtype) + " " + ShapeString(r.shape);
}

std::string RankList(const std::vector<bool>& present) {
  std::string out;
  for (size_t r = 0; r < present.size(); ++r) {
    if (present[r]) out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

}  // namespace

std::string Controller::Counterpart(const std::string& name, const Pending& p) const {
  // A tensor submitted by exactly the ranks this one lacks, and by none of
  // its ranks, with the same operation: most likely one call whose name
  // (for torch.distributed, its dtype or shape) differs between the ranks.
  if (p.members_only || p.first < 0) return "";
  const Request& mine = p.by_rank[p.first];
  for (const auto& kv : table_) {
    const Pending& q = kv.second;
    if (kv.first == name || q.members_only || q.first < 0 || q.present.size() != p.present.size() ||
        q.by_rank[q.first].op != mine.op) {
      continue;
    }
    bool complementary = true;
    for (size_t r = 0; r < p.present.size() && complementary; ++r) {
      complementary = p.present[r] != q.present[r];
    }
    if (complementary) {
      return "; ranks [" + RankList(q.present) + "] submitted '" + kv.first + "' (" +
             Metadata(q.by_rank[q.first]) + ") instead of this (" + Metadata(mine) +
             "): if the two are one call, the ranks disagree on its name, dtype or shape";
    }
  }
  return "";
}

std::string Controller::InspectStalls() {
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_stall_check_).count() < 1.0) return "";
  last_stall_check_ = now;
  std::string give_up;
  double give_up_age = 0;
  for (auto& kv : table_) {
    Pending& p = kv.second;
    const double age = std::chrono::duration<double>(now - p.first_seen).count();
    auto describe = [&] {
      std::string have, missing;
      for (size_t r = 0; r < p.present.size(); ++r) {
        // The other ranks have no part in a members-only add.
        if (!p.present[r] && p.members_only && !IsMember(p.by_rank[p.first].set_ranks, r)) continue;
        std::string& dst = p.present[r] ? have : missing;
        dst += (dst.empty() ? "" : ", ") + std::to_string(r);
      }
      const Request* any = nullptr;
      for (size_t r = 0; r < p.present.size() && !any; ++r) {
        if (p.present[r]) any = &p.by_rank[r];
      }
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%.1f", age);
      return "tensor '" + kv.first + "' (" + (any ? OpTypeName(any->op) : "?") +
             ") has waited " + seconds + " s: submitted by ranks [" + have +
             "] but not by ranks [" + missing + "]" + Counterpart(kv.first, p);
    };
    if (options_.stall_check_enabled && options_.stall_check_seconds > 0 && !p.warned &&
        age >= options_.stall_check_seconds) {
      p.warned = true;
      stats_->Add(stats_->stall_warnings, 1);
      std::fprintf(stderr,
                   "[hvdlite] WARNING stall inspector: %s. A rank may be stuck, or ranks call "
                   "collectives in different sequences or with different names.\n",
                   describe().c_str());
      std::fflush(stderr);
    }
    // The oldest stalled tensor is the one that names the culprit.
    if (options_.stall_shutdown_seconds > 0 && age >= options_.stall_shutdown_seconds &&
        age > give_up_age) {
      give_up_age = age;
      char limit[32];  // %g: a limit of 0.5 s reads 0.5, not 0
      std::snprintf(limit, sizeof(limit), "%g", options_.stall_shutdown_seconds);
      give_up = std::string("stall inspector stopped hvdlite (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=") +
                limit + "): " + describe();
    }
  }
  return give_up;
}

namespace {

// A shutdown any rank asked for (or the stall inspector's) ends the round:
// `result` then carries who asked and why.
bool CollectShutdowns(const std::vector<RequestList>& all, const std::string& stall_error,
                      ResponseList* result) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].shutdown) {
      result->shutdown = true;
      result->shutdown_ranks.push_back(static_cast<int>(r));
      result->shutdown_reasons.push_back(all[r].shutdown_reason);
    }
  }
  if (!stall_error.empty()) {
    result->stall_error = stall_error;
    result->shutdown = true;
  }
  return result->shutdown;
}

}  // namespace

ResponseList Controller::Coordinate(const std::vector<RequestList>& all) {
  ResponseList result;
  const int size = static_cast<int>(all.size());
  if (CollectShutdowns(all, stall_shutdown_, &result)) return result;

  const auto now = Clock::now();
  std::vector<std::string> ready;
  std::unordered_set<std::string> invalidated;
  std::string join_name;
  for (int r = 0; r < size; ++r) {
    for (const Request& q : all[r].requests) {
      if (q.op == OpType::kJoin) {
        joins_.Join(r, size);
        join_name = q.name;
        // Cached responses assume every rank submits: drop them all.
        for (int s = 0; s < cache_.num_slots(); ++s) {
          if (!cache_.used(s)) continue;
          const std::string& name = cache_.response(s).name();
          if (invalidated.insert(name).second) result.invalidated.push_back(name);
        }
        continue;
      }
      // An uncached request for a cached name means its metadata changed on
      // that rank (or it waited too long): the slot is dropped everywhere.
      if (cache_.SlotOf(q.name) >= 0 && invalidated.insert(q.name).second) {
        result.invalidated.push_back(q.name);
      }
      if (Record(q, r, size, now)) ready.push_back(q.name);
    }
  }
  if (joins_.any()) AddReadyWithJoined(&ready);
  for (const auto& name : ready) {
    result.responses.push_back(Decide(table_[name]));
    table_.erase(name);
  }
  if (joins_.all()) {
    Response join;
    join.request.op = OpType::kJoin;
    join.request.name = join_name.empty() ? "join" : join_name;
    join.last_joined_rank = joins_.last();
    join.cacheable = false;
    result.responses.push_back(std::move(join));
    joins_.Reset();
  }
  return result;
}

bool Controller::Record(const Request& q, int r, int size, Clock::time_point now) {
  auto it = table_.find(q.name);
  if (it == table_.end()) {
    Pending p;
    p.by_rank.resize(size);
    p.present.assign(size, false);
    p.first_seen = now;
    p.members_only = q.op == OpType::kAddProcessSet && q.members_only;
    p.needed = p.members_only ? static_cast<int>(q.set_ranks.size()) : size;
    it = table_.emplace(q.name, std::move(p)).first;
  }
  Pending& p = it->second;
  if (p.present[r]) return false;  // TensorQueue refuses in-flight duplicates
  const bool conflict = Conflicts(p.first < 0 ? q : p.by_rank[p.first], q, r);
  if (p.first < 0) p.first = r;
  p.by_rank[r] = q;
  p.by_rank[r].rank = r;
  p.present[r] = true;
  ++p.count;
  if (p.ready || (!conflict && p.count != p.needed)) return false;
  p.ready = true;
  return true;
}

void Controller::AddReadyWithJoined(std::vector<std::string>* ready) const {
  // Tensors waiting only on joined ranks are ready: those ranks send zeros.
  for (const auto& kv : table_) {
    const Pending& p = kv.second;
    if (p.ready) continue;
    int have = 0;
    for (int r = 0; r < static_cast<int>(p.present.size()); ++r) {
      const bool counts = !p.members_only || IsMember(p.by_rank[p.first].set_ranks, r);
      have += counts && (p.present[r] || joins_.joined(r));
    }
    if (have == p.needed) ready->push_back(kv.first);
  }
}

Response Controller::Decide(const Pending& pending) const {
  // Only ranks that submitted take part in the checks; joined ranks follow.
  // A members-only add does not wait for the other ranks: they have not joined.
  std::vector<Request> q;
  std::string joined;
  for (size_t r = 0; r < pending.by_rank.size(); ++r) {
    if (pending.present[r]) {
      q.push_back(pending.by_rank[r]);
    } else if (!pending.members_only || IsMember(pending.by_rank[pending.first].set_ranks, r)) {
      joined += (joined.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  const Request& first = q[0];
  Response response;
  response.request = first;
  // Ranks without the tensor (joined, or not members) take the response without a queue entry.
  response.cacheable = pending.count == static_cast<int>(pending.by_rank.size());
  std::string error = FindMismatch(q);
  const OpType op = first.op;
  // Horovod's rule: once a rank has joined, only allreduce goes on (the
  // joined ranks contribute zeros); collectives whose result depends on the
  // joined ranks' data or layout fail on every rank that issued them.
  if (error.empty() && !joined.empty() && op != OpType::kAllreduce && op != OpType::kBarrier) {
    error = std::string(OpTypeName(op)) + " of '" + first.name +
            "' is not supported (only allreduce is; as in Horovod) while ranks [" + joined +
            "] have joined; issue it before join()";
  }
  if (!error.empty()) {
    response.kind = Response::Kind::kError;
    response.error = std::move(error);
    return response;
  }
  const int64_t size = static_cast<int64_t>(pending.by_rank.size());
  switch (op) {
    case OpType::kAllgather:
      for (size_t r = 0; r < pending.by_rank.size(); ++r) {
        const auto& x = pending.by_rank[r];
        response.rows_per_rank.push_back(x.shape.empty() ? 1 : x.shape[0]);
      }
      break;
    case OpType::kAlltoall:
      for (const auto& x : q) {
        response.splits_matrix.insert(response.splits_matrix.end(), x.splits.begin(), x.splits.end());
      }
      break;
    case OpType::kReducescatter: {
      const int64_t rows = first.shape.empty() ? 1 : first.shape[0];
      for (int64_t r = 0; r < size; ++r) {
        response.rows_per_rank.push_back(rows / size + (r < rows % size));
      }
      break;
    }
    default:
      break;
  }
  return response;
}

}  // namespace hvdlite

// Negotiation for one process set: which tensors are ready on every rank, in
// what order, and whether their metadata agree. Rank 0 of the set is the
// coordinator. Each round costs one small bitwise-AND allreduce; it carries a
// "quiet" flag and one bit per response-cache slot, so tensors seen before
// are agreed on without the coordinator. Only when some rank has something
// new does the round add a gather to the coordinator and a broadcast back.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine_options.h"
#include "engine/engine_stats.h"
#include "negotiation/join_state.h"
#include "negotiation/message.h"
#include "negotiation/response_cache.h"
#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

class Controller {
 public:
  // `transport`: the set's wire, which carries each round's exchanges.
  Controller(Transport* transport, const EngineOptions& options, EngineStats* stats);

  // One round, collective over the set. `shutdown` (with its reason) asks all
  // ranks to stop. `out` gets the same ordered responses on every rank.
  Status Negotiate(std::vector<Request> new_requests, bool shutdown,
                   const std::string& shutdown_reason, ResponseList* out);
  // Whether this rank has announced tensors that other ranks have not
  // submitted yet: they will, soon, and the round that agrees on them should
  // not wait for this rank's cycle timer.
  bool waiting() const { return !cached_waiting_.empty() || !sent_.empty() || !retry_.empty(); }

 private:
  friend class ControllerTest;  // tests/cpp/test_controller.cc drives Coordinate without MPI
  using Clock = std::chrono::steady_clock;
  struct Pending {  // coordinator: one name, waiting for all ranks (or all members)
    std::vector<Request> by_rank;
    std::vector<bool> present;
    int count = 0;
    int needed = 0;             // submissions that make it ready: every rank, or every member
    int first = -1;             // the rank whose request came first
    bool members_only = false;  // an add_process_set that only the new set's members submit
    bool ready = false;         // in this round's ready list
    Clock::time_point first_seen;
    bool warned = false;
  };
  struct CachedWait {  // this rank: a request waiting for its cache bit everywhere
    Request request;
    Clock::time_point since;
  };

  // The steps of one round. Sort: new requests whose metadata the cache
  // holds wait for their slot's bit; the rest (and cached ones waiting too
  // long) go to the coordinator.
  RequestList Sort(std::vector<Request> new_requests, Clock::time_point now);
  // The bitwise AND: cached slots ready on every rank become responses;
  // `quiet`: no rank has anything for the coordinator this round.
  Status AgreeOnCached(const RequestList& mine, ResponseList* out, bool* quiet);
  // Gather every rank's requests on the coordinator, broadcast its decision.
  Status AskCoordinator(const RequestList& mine, ResponseList* slow);
  // Apply the coordinator's decision: invalidations, cache entries, responses.
  void Learn(ResponseList slow, ResponseList* out);
  ResponseList Coordinate(const std::vector<RequestList>& all);
  // Coordinator: records rank `r`'s request; true when that makes it ready.
  bool Record(const Request& q, int r, int size, Clock::time_point now);
  // Coordinator: adds to `ready` the tensors every rank but joined ones has submitted.
  void AddReadyWithJoined(std::vector<std::string>* ready) const;
  Response Decide(const Pending& pending) const;
  // Coordinator: warns about tensors missing on some ranks; returns a
  // message when the stall shutdown time has passed.
  std::string InspectStalls();
  // The stall inspector's hint: the pending tensor that ``p``'s missing ranks
  // submitted in its place, if one fits (empty otherwise).
  std::string Counterpart(const std::string& name, const Pending& p) const;
  void ForgetCached(const std::string& name);

  Transport* transport_;
  EngineOptions options_;
  EngineStats* stats_;
  ResponseCache cache_;
  uint64_t tick_ = 0;
  std::map<int, CachedWait> cached_waiting_;        // by slot
  std::vector<Request> retry_;                      // to send uncached next round
  std::unordered_map<std::string, Request> sent_;   // sent to the coordinator, unanswered
  std::unordered_map<std::string, Pending> table_;  // coordinator state
  Clock::time_point last_stall_check_;
  std::string stall_shutdown_;                      // coordinator: pending stall error
  JoinState joins_;  // coordinator
};

}  // namespace hvdlite

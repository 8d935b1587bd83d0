// Negotiation for one process set: which tensors are ready on every rank, in
// what order, and whether their metadata agree. Rank 0 of the set is the
// coordinator; each round costs one small bitwise-AND allreduce, plus a
// gather/broadcast only when some rank has something new to say.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/mpi_collectives.h"
#include "message.h"
#include "status.h"

namespace hvdlite {

class Controller {
 public:
  explicit Controller(MpiCollectives* mpi) : mpi_(mpi) {}

  // One round: every rank of the set calls it with what it has to say and
  // gets the same ordered response list back.
  Status Negotiate(const RequestList& mine, ResponseList* out);

  // Coordinator only: names waiting on some ranks for longer than `age`,
  // with the ranks that have not submitted them.
  struct Stalled {
    std::string name;
    std::vector<int32_t> missing_ranks;
    double seconds = 0.0;
  };
  std::vector<Stalled> StalledTensors(double min_age_seconds) const;

 private:
  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> present;
    int count = 0;
    std::chrono::steady_clock::time_point first_seen;
  };

  ResponseList Coordinate(const std::vector<RequestList>& all);
  Response Decide(const Pending& pending) const;

  MpiCollectives* mpi_;
  std::unordered_map<std::string, Pending> table_;  // coordinator state
};

}  // namespace hvdlite

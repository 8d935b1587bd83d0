// Checks of the coordinator's decisions (csrc/negotiation/controller.cc: Coordinate and
// Decide), fed the ranks' request lists directly, without MPI: readiness,
// per-op sizes, the mismatch messages field by field, shutdown, join, cache
// invalidation and the stall inspector. Negotiate itself (the bit-vector
// round over MPI or shared memory) needs a transport to fake and is covered
// by the multi-rank tests.
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "negotiation/controller.h"

#include "check.h"

using hvdlite_test::RunTests;

namespace hvdlite {

// The one friend of Controller: its coordinator state, with no MPI behind it.
class ControllerTest {
 public:
  explicit ControllerTest(EngineOptions options = EngineOptions())
      : controller_(nullptr, options, &stats_) {}

  // One round: what each rank sent (index = rank).
  ResponseList Round(const std::vector<std::vector<Request>>& by_rank,
                     const std::vector<std::string>& shutdown_reasons = {}) {
    std::vector<RequestList> all(by_rank.size());
    for (size_t r = 0; r < by_rank.size(); ++r) {
      all[r].requests = by_rank[r];
      if (r < shutdown_reasons.size() && !shutdown_reasons[r].empty()) {
        all[r].shutdown = true;
        all[r].shutdown_reason = shutdown_reasons[r];
      }
    }
    return controller_.Coordinate(all);
  }
  std::string InspectStalls() { return controller_.InspectStalls(); }
  ResponseCache& cache() { return controller_.cache_; }
  EngineStats& stats() { return stats_; }

 private:
  EngineStats stats_;
  Controller controller_;
};

}  // namespace hvdlite

using namespace hvdlite;

namespace {

Request Q(const std::string& name, OpType op = OpType::kAllreduce, std::vector<int64_t> shape = {4, 3}) {
  Request q;
  q.name = name;
  q.op = op;
  q.shape = std::move(shape);
  return q;
}

bool Contains(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

void TestReadyWhenEveryRankSubmitted() {
  ControllerTest c;
  ResponseList out = c.Round({{Q("a")}, {}, {Q("a")}});
  CHECK(out.responses.empty() && !out.shutdown, "'a' decided before rank 1 sent it");
  Request late = Q("a");
  late.rank = 1;
  out = c.Round({{Q("b")}, {late, Q("b")}, {Q("b")}});
  CHECK(out.responses.size() == 2, "%zu responses, want 2", out.responses.size());
  if (out.responses.size() != 2) return;
  const Response& a = out.responses[0];
  CHECK(a.name() == "a" && out.responses[1].name() == "b", "in the order they became ready");
  CHECK(a.kind == Response::Kind::kCollective && a.op() == OpType::kAllreduce &&
            a.request.dtype == DataType::kFloat32 && a.cacheable,
        "a plain allreduce");
  CHECK(a.request.rank == 0 && a.request.shape == std::vector<int64_t>({4, 3}),
        "the request is the lowest rank's");
  out = c.Round({{Q("a")}, {Q("a")}, {Q("a")}});
  CHECK(out.responses.size() == 1, "a name is decided again once it has completed");
}

void TestSizesPerOp() {
  ControllerTest c;
  ResponseList out = c.Round({{Q("g", OpType::kAllgather, {2, 3})},
                              {Q("g", OpType::kAllgather, {5, 3})},
                              {Q("g", OpType::kAllgather, {0, 3})}});
  CHECK(out.responses.size() == 1 && out.responses[0].kind == Response::Kind::kCollective &&
            out.responses[0].rows_per_rank == std::vector<int64_t>({2, 5, 0}),
        "allgather: every rank's first dimension");
  out = c.Round({{Q("s", OpType::kAllgather, {})}, {Q("s", OpType::kAllgather, {})},
                 {Q("s", OpType::kAllgather, {})}});
  CHECK(out.responses.size() == 1 && out.responses[0].rows_per_rank == std::vector<int64_t>({1, 1, 1}),
        "allgather of 0-d tensors: one row each");
  std::vector<std::vector<Request>> a2a(3);
  for (int r = 0; r < 3; ++r) {
    Request q = Q("x", OpType::kAlltoall, {3 * r, 2});
    q.splits = {r, r, r};
    a2a[r] = {q};
  }
  out = c.Round(a2a);
  CHECK(out.responses.size() == 1 &&
            out.responses[0].splits_matrix == std::vector<int64_t>({0, 0, 0, 1, 1, 1, 2, 2, 2}),
        "alltoall: the splits matrix, one row per sender");
  out = c.Round({{Q("rs", OpType::kReducescatter, {7, 2})}, {Q("rs", OpType::kReducescatter, {7, 2})},
                 {Q("rs", OpType::kReducescatter, {7, 2})}});
  CHECK(out.responses.size() == 1 && out.responses[0].rows_per_rank == std::vector<int64_t>({3, 2, 2}),
        "reducescatter: rows per rank, the first ranks one more");
  Request add = Q("ps", OpType::kAddProcessSet, {});
  add.set_ranks = {0, 2};
  out = c.Round({{add}, {add}, {add}});
  CHECK(out.responses.size() == 1 && out.responses[0].request.set_ranks == std::vector<int32_t>({0, 2}),
        "add_process_set: the set's ranks");
  for (const auto& r : out.responses) {
    CHECK(r.rows_per_rank.empty() && r.splits_matrix.empty() && r.last_joined_rank == -1,
          "no other operation's fields");
  }
}

struct MismatchCase {
  const char* field;  // as the message names it
  Request base;
  std::function<void(Request&)> change;  // applied to rank 1's request
  const char* ours;                      // ranks 0 and 2
  const char* theirs;                    // rank 1
};

void TestMismatchMessages() {
  Request bcast = Q("t", OpType::kBroadcast);
  Request gather = Q("t", OpType::kAllgather);
  Request reduce = Q("t");
  Request add = Q("t", OpType::kAddProcessSet, {});
  add.set_ranks = {0, 1};
  Request remove = Q("t", OpType::kRemoveProcessSet, {});
  remove.target_set = 3;
  std::vector<MismatchCase> cases = {
      {"operation", reduce, [](Request& q) { q.op = OpType::kAllgather; }, "allreduce", "allgather"},
      {"dtype", reduce, [](Request& q) { q.dtype = DataType::kInt16; }, "float32", "int16"},
      {"shape", reduce, [](Request& q) { q.shape = {4, 4}; }, "[4, 3]", "[4, 4]"},
      {"shape", bcast, [](Request& q) { q.shape = {}; }, "[4, 3]", "[]"},
      {"number of dimensions", gather, [](Request& q) { q.shape = {4, 3, 1}; }, "2", "3"},
      {"trailing dimensions (all but the first must agree)", gather,
       [](Request& q) { q.shape = {4, 2}; }, "[3]", "[2]"},
      {"reduce op", reduce, [](Request& q) { q.reduce_op = ReduceOp::kMax; }, "Sum", "Max"},
      {"prescale_factor", reduce, [](Request& q) { q.prescale = 0.5; }, "1", "0.5"},
      {"postscale_factor", reduce, [](Request& q) { q.postscale = 2; }, "1", "2"},
      {"compression", reduce, [](Request& q) { q.compression.type = CompressionType::kFP16; },
       "none", "fp16"},
      {"root rank", bcast, [](Request& q) { q.root_rank = 2; }, "0", "2"},
      {"process set ranks", add, [](Request& q) { q.set_ranks = {0, 2}; }, "[0, 1]", "[0, 2]"},
      {"process set", remove, [](Request& q) { q.target_set = 4; }, "3", "4"},
  };
  for (const auto& m : cases) {
    ControllerTest c;
    Request theirs = m.base;
    m.change(theirs);
    ResponseList out = c.Round({{m.base}, {theirs}, {m.base}});
    if (out.responses.size() != 1) {
      CHECK(false, "%s: %zu responses", m.field, out.responses.size());
      continue;
    }
    const Response& p = out.responses[0];
    const std::string want = std::string("Mismatched ") + m.field + " for tensor 't': " + m.ours +
                             " on ranks 0, 2; " + m.theirs + " on rank 1. Every rank must submit "
                             "the same name with the same " + m.field + ".";
    CHECK(p.kind == Response::Kind::kError && p.error == want, "%s:\n   got: %s\n  want: %s", m.field,
          p.error.c_str(), want.c_str());
  }
  // What may differ: allgather's first dimension, and fields an op does not
  // use (a broadcast's reduce op, an allreduce's root rank).
  Request g = Q("g", OpType::kAllgather), b = Q("b", OpType::kBroadcast), r = Q("r");
  Request g1 = g, b1 = b, r1 = r;
  g1.shape = {9, 3};
  b1.reduce_op = ReduceOp::kMin;
  r1.root_rank = 2;
  ControllerTest c;
  ResponseList out = c.Round({{g, b, r}, {g1, b1, r1}, {g, b, r}});
  bool all_ok = out.responses.size() == 3;
  for (const auto& p : out.responses) all_ok = all_ok && p.kind == Response::Kind::kCollective;
  CHECK(all_ok, "differences an op ignores are not mismatches");
}

void TestShutdownStopsTheRound() {
  ControllerTest c;
  ResponseList out = c.Round({{Q("a")}, {Q("a")}, {Q("a")}}, {"", "called hvdlite.shutdown()", "exited"});
  CHECK(out.shutdown && out.responses.empty(), "a shutdown decides nothing else");
  CHECK(out.shutdown_ranks == std::vector<int32_t>({1, 2}), "the ranks that stop");
  CHECK(out.shutdown_reasons == std::vector<std::string>({"called hvdlite.shutdown()", "exited"}),
        "and why");
}

void TestJoin() {
  ControllerTest c;
  Request join = Q("join.0", OpType::kJoin, {});
  ResponseList out = c.Round({{Q("g")}, {Q("g"), Q("h", OpType::kAllgather)}, {join}});
  CHECK(out.responses.size() == 1 && out.responses[0].name() == "g",
        "an allreduce waiting only on a joined rank is ready");
  if (!out.responses.empty()) {
    CHECK(out.responses[0].kind == Response::Kind::kCollective && !out.responses[0].cacheable,
          "decided while a rank had joined: not cacheable");
  }
  out = c.Round({{Q("h", OpType::kAllgather), Q("b", OpType::kBarrier, {})}, {Q("b", OpType::kBarrier, {})}, {}});
  CHECK(out.responses.size() == 2, "%zu responses", out.responses.size());
  for (const auto& p : out.responses) {
    if (p.name() == "h") {
      CHECK(p.kind == Response::Kind::kError &&
                p.error == "allgather of 'h' is not supported (only allreduce is; as in Horovod) "
                           "while ranks [2] have joined; issue it before join()",
            "allgather with a joined rank: %s", p.error.c_str());
    } else {
      CHECK(p.kind == Response::Kind::kCollective, "a barrier goes on with a joined rank");
    }
  }
  out = c.Round({{join}, {}, {}});
  CHECK(out.responses.empty(), "not every rank has joined");
  out = c.Round({{}, {join}, {}});
  CHECK(out.responses.size() == 1 && out.responses[0].op() == OpType::kJoin &&
            out.responses[0].name() == "join.0" && out.responses[0].last_joined_rank == 1 &&
            !out.responses[0].cacheable,
        "every rank joined: the join completes with the last rank to join");
  out = c.Round({{Q("z")}, {}, {Q("z")}});
  CHECK(out.responses.empty(), "after the join every rank takes part again");
}

void TestCachedNamesInvalidated() {
  ControllerTest c;
  std::string evicted;
  Response cached;
  cached.request.name = "c";
  c.cache().Put(cached, Q("c"), 1, &evicted);
  Response other = cached;
  other.request.name = "d";
  c.cache().Put(other, Q("d"), 1, &evicted);
  ResponseList out = c.Round({{Q("c")}, {}, {}});
  CHECK(out.invalidated == std::vector<std::string>({"c"}),
        "a cached name sent to the coordinator is dropped everywhere");
  out = c.Round({{}, {Q("j", OpType::kJoin, {})}, {}});
  CHECK(out.invalidated == std::vector<std::string>({"c", "d"}), "a join drops every cached name");
}

void TestStallInspector() {
  EngineOptions options;
  options.stall_check_seconds = 0.2;
  options.stall_shutdown_seconds = 0.5;
  ControllerTest c(options);
  c.Round({{Q("slow")}, {}, {Q("slow")}});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // it looks once a second
  const std::string message = c.InspectStalls();
  CHECK(Contains(message, "tensor 'slow' (allreduce) has waited") &&
            Contains(message, "submitted by ranks [0, 2] but not by ranks [1]") &&
            Contains(message, "(HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=0.5): "),
        "stall message: %s", message.c_str());
  CHECK(c.stats().stall_warnings.load() == 1, "one warning, %lld",
        static_cast<long long>(c.stats().stall_warnings.load()));
}

void TestStallNamesTheCounterpart() {
  // Ranks 0 and 2 wait in 'grad.a'; rank 1 waits in 'grad_a', of another
  // shape, that they never submit: the message names it and both shapes.
  // 'other' (a broadcast, by rank 1 too) is not of the same operation.
  EngineOptions options;
  options.stall_check_seconds = 0.2;
  options.stall_shutdown_seconds = 0.5;
  ControllerTest c(options);
  c.Round({{Q("grad.a")}, {Q("other", OpType::kBroadcast), Q("grad_a", OpType::kAllreduce, {4, 2})},
           {Q("grad.a")}});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string message = c.InspectStalls();
  CHECK(Contains(message, "submitted by ranks [0, 2] but not by ranks [1]; ranks [1] submitted "
                          "'grad_a' (allreduce, float32 [4, 2]) instead of this (allreduce, "
                          "float32 [4, 3]): if the two are one call") ||
            Contains(message, "submitted by ranks [1] but not by ranks [0, 2]; ranks [0, 2] "
                              "submitted 'grad.a' (allreduce, float32 [4, 3]) instead of this "
                              "(allreduce, float32 [4, 2])"),
        "stall message: %s", message.c_str());
  ControllerTest alone(options);
  alone.Round({{Q("slow")}, {Q("other", OpType::kBroadcast)}, {Q("slow")}});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string plain = alone.InspectStalls();
  CHECK(Contains(plain, "has waited") && !Contains(plain, "instead of this"),
        "no counterpart of another operation: %s", plain.c_str());
}

Request MembersAdd(const std::string& name, std::vector<int32_t> ranks) {
  Request q = Q(name, OpType::kAddProcessSet, {});
  q.set_ranks = std::move(ranks);
  q.members_only = true;
  return q;
}

void TestMembersOnlyAdd() {
  // 4 ranks: [0, 1] and [2, 3] each added by their members alone, at once.
  ControllerTest c;
  const Request a = MembersAdd("a", {0, 1}), b = MembersAdd("b", {2, 3});
  ResponseList out = c.Round({{a}, {}, {b}, {}});
  CHECK(out.responses.empty(), "decided before every member submitted");
  out = c.Round({{}, {a}, {}, {b}});
  CHECK(out.responses.size() == 2, "%zu responses, want 2", out.responses.size());
  if (out.responses.size() != 2) return;
  CHECK(out.responses[0].name() == "a" && out.responses[1].name() == "b",
        "in the order they became ready, the order every rank applies them in");
  for (const auto& p : out.responses) {
    CHECK(p.kind == Response::Kind::kCollective && p.request.members_only && !p.cacheable,
          "%s: a members-only add, taken by the other ranks without a queue entry: %s",
          p.name().c_str(), p.error.c_str());
  }
  CHECK(out.responses[0].request.set_ranks == std::vector<int32_t>({0, 1}), "the set's ranks");
  out = c.Round({{MembersAdd("solo", {0})}, {}, {}, {}});
  CHECK(out.responses.size() == 1 && out.responses[0].kind == Response::Kind::kCollective,
        "a set of one rank is ready at once");
  Request everyone = MembersAdd("all", {0, 1, 2, 3});
  out = c.Round({{everyone}, {everyone}, {everyone}, {}});
  CHECK(out.responses.empty(), "a members-only add of every rank waits for every rank");
}

void TestMembersOnlyAddErrors() {
  // Each decided as soon as it cannot succeed, not when every rank has sent it.
  struct ErrorCase {
    const char* what;
    std::vector<std::vector<Request>> rounds;  // rank 0's, 1's, 2's, 3's requests, one round
    const char* words;
  };
  Request all_ranks = MembersAdd("t", {0, 1});
  all_ranks.members_only = false;
  const std::vector<ErrorCase> cases = {
      {"a non-member submits", {{MembersAdd("t", {0, 1})}, {}, {MembersAdd("t", {0, 1})}, {}},
       "add_process_set of 't': ranks [2] submitted it but are not members of the new process set [0, 1]"},
      {"a non-member alone", {{}, {}, {}, {MembersAdd("t", {0, 1})}}, "ranks [3] submitted it but are not members"},
      {"members disagree on the ranks", {{MembersAdd("t", {0, 1})}, {MembersAdd("t", {0, 1, 2})}, {}, {}},
       "Mismatched process set ranks for tensor 't': [0, 1] on rank 0; [0, 1, 2] on rank 1."},
      {"members only and all ranks", {{MembersAdd("t", {0, 1})}, {all_ranks}, {}, {}},
       "Mismatched submitters of add_process_set for tensor 't': members only on rank 0; all ranks on rank 1."},
      {"all ranks, then members only", {{all_ranks}, {MembersAdd("t", {0, 1})}, {}, {}},
       "all ranks on rank 0; members only on rank 1"},
      {"another collective of the name", {{Q("t")}, {MembersAdd("t", {0, 1})}, {}, {}},
       "Mismatched operation for tensor 't': allreduce on rank 0; add_process_set on rank 1."},
  };
  for (const auto& e : cases) {
    ControllerTest c;
    ResponseList out = c.Round(e.rounds);
    const bool one_error = out.responses.size() == 1 && out.responses[0].kind == Response::Kind::kError;
    CHECK(one_error && Contains(out.responses[0].error, e.words) && !out.responses[0].cacheable,
          "%s: %zu responses, %s", e.what, out.responses.size(),
          out.responses.empty() ? "" : out.responses[0].error.c_str());
  }
  ControllerTest c;
  c.Round({{MembersAdd("t", {0, 1})}, {}, {}, {}});
  ResponseList out = c.Round({{}, {MembersAdd("t", {0, 1, 3})}, {}, {}});
  CHECK(out.responses.size() == 1 && out.responses[0].kind == Response::Kind::kError,
        "a disagreement in a later round is decided then");
}

void TestMembersOnlyAddWithJoin() {
  ControllerTest c;
  Request join = Q("join.0", OpType::kJoin, {});
  ResponseList out = c.Round({{MembersAdd("a", {0, 1})}, {MembersAdd("a", {0, 1})}, {join}});
  CHECK(out.responses.size() == 1 && out.responses[0].kind == Response::Kind::kCollective,
        "a non-member that joined has no part in it: %s",
        out.responses.empty() ? "" : out.responses[0].error.c_str());
  out = c.Round({{MembersAdd("b", {0, 2})}, {}, {}});
  CHECK(out.responses.size() == 1 && out.responses[0].kind == Response::Kind::kError &&
            Contains(out.responses[0].error, "while ranks [2] have joined"),
        "a member that joined: %s", out.responses.empty() ? "" : out.responses[0].error.c_str());
}

void TestStallOfMembersOnlyAdd() {
  EngineOptions options;
  options.stall_check_seconds = 0.2;
  options.stall_shutdown_seconds = 0.5;
  ControllerTest c(options);
  c.Round({{}, {MembersAdd("slow", {1, 2})}, {}, {}});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string message = c.InspectStalls();
  CHECK(Contains(message, "tensor 'slow' (add_process_set)") &&
            Contains(message, "submitted by ranks [1] but not by ranks [2]"),
        "only the members are missing: %s", message.c_str());
}

}  // namespace

int main() {
  return RunTests({
      {"ready when every rank submitted", TestReadyWhenEveryRankSubmitted},
      {"sizes per op", TestSizesPerOp},
      {"mismatch messages, field by field", TestMismatchMessages},
      {"shutdown stops the round", TestShutdownStopsTheRound},
      {"join", TestJoin},
      {"cached names invalidated", TestCachedNamesInvalidated},
      {"stall inspector", TestStallInspector},
      {"stall inspector names the counterpart", TestStallNamesTheCounterpart},
      {"members-only add", TestMembersOnlyAdd},
      {"members-only add errors", TestMembersOnlyAddErrors},
      {"members-only add with join", TestMembersOnlyAddWithJoin},
      {"stall of a members-only add", TestStallOfMembersOnlyAdd},
  });
}

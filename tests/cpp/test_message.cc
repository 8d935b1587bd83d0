// Checks of csrc/message: every field of RequestList and ResponseList survives
// Serialize -> Deserialize (odd names, empty and extreme shapes, NaN and -0.0
// factors bit for bit); every truncated message throws instead of reading
// past its end. No MPI. (Not checked: a corrupted element count, which today
// is allocated before it is checked against the bytes left.)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "negotiation/message.h"

#include "check.h"

using namespace hvdlite;
using hvdlite_test::RunTests;

namespace {

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

bool SameRequest(const Request& a, const Request& b) {
  return a.rank == b.rank && a.op == b.op && a.name == b.name && a.auto_named == b.auto_named &&
         a.dtype == b.dtype && a.shape == b.shape && a.reduce_op == b.reduce_op &&
         SameBits(a.prescale, b.prescale) && SameBits(a.postscale, b.postscale) &&
         a.root_rank == b.root_rank && a.splits == b.splits && a.set_ranks == b.set_ranks &&
         a.members_only == b.members_only && a.target_set == b.target_set && a.device == b.device &&
         a.compression.type == b.compression.type &&
         SameBits(a.compression.topk_ratio, b.compression.topk_ratio) &&
         a.compression.error_feedback == b.compression.error_feedback;
}

bool SameResponse(const Response& a, const Response& b) {
  return a.kind == b.kind && SameRequest(a.request, b.request) && a.error == b.error &&
         a.rows_per_rank == b.rows_per_rank && a.splits_matrix == b.splits_matrix &&
         a.last_joined_rank == b.last_joined_rank && a.cacheable == b.cacheable;
}

std::vector<Request> OddRequests() {
  const int64_t big = std::numeric_limits<int64_t>::max();
  std::vector<Request> all;
  Request a;  // every field away from its default
  a.rank = 7;
  a.op = OpType::kAlltoall;
  a.name = "grad.layer1/weight:0";
  a.auto_named = true;
  a.dtype = DataType::kBFloat16;
  a.shape = {3, 0, big};
  a.reduce_op = ReduceOp::kProduct;
  a.prescale = std::nan("");
  a.postscale = -0.0;
  a.root_rank = -1;
  a.splits = {0, -5, big, std::numeric_limits<int64_t>::min()};
  a.compression.type = CompressionType::kTopK;
  a.compression.topk_ratio = 0.1;
  a.compression.error_feedback = true;
  all.push_back(a);
  Request b;  // defaults: empty name, 0-d shape, no splits
  all.push_back(b);
  Request c;
  c.name = std::string("nul\0inside\xff\xfe", 13);
  c.op = OpType::kJoin;
  c.prescale = std::numeric_limits<double>::infinity();
  c.postscale = std::numeric_limits<double>::denorm_min();
  c.shape = {1};
  all.push_back(c);
  Request d;
  d.name = std::string(100000, 'x');  // longer than any small-buffer optimisation
  d.op = OpType::kAddProcessSet;
  d.set_ranks = {0, 2, std::numeric_limits<int32_t>::max()};
  d.members_only = true;
  all.push_back(d);
  Request e;
  e.op = OpType::kRemoveProcessSet;
  e.target_set = std::numeric_limits<int32_t>::min();
  all.push_back(e);
  return all;
}

RequestList OddRequestList() {
  RequestList list;
  list.requests = OddRequests();
  list.shutdown = true;
  list.shutdown_reason = "rank 3 exited with an unhandled exception: ValueError: x";
  return list;
}

ResponseList OddResponseList() {
  ResponseList list;
  Response ok;
  ok.request = OddRequests()[0];
  ok.rows_per_rank = {1, 0, 4};
  ok.splits_matrix = {0, -1, std::numeric_limits<int64_t>::max()};
  ok.last_joined_rank = 5;
  ok.cacheable = false;
  list.responses.push_back(ok);
  Response error;
  error.kind = Response::Kind::kError;
  error.request.op = OpType::kBroadcast;
  error.request.name = "b";
  error.error = "Mismatched root rank for tensor 'b': 0 on rank 0; 1 on rank 1.";
  list.responses.push_back(error);
  list.responses.emplace_back();  // all defaults
  list.shutdown = true;
  list.shutdown_ranks = {0, 2};
  list.shutdown_reasons = {"called hvdlite.shutdown()", ""};
  list.invalidated = {"x", std::string("y\0z", 3)};
  list.stall_error = "stall inspector stopped hvdlite";
  list.idle = true;  // not serialized: every rank computes it
  return list;
}

void TestRequestListRoundTrip() {
  for (const RequestList& list : {OddRequestList(), RequestList()}) {
    const std::vector<uint8_t> bytes = Serialize(list);
    const RequestList back = DeserializeRequestList(bytes.data(), bytes.size());
    CHECK(back.shutdown == list.shutdown && back.shutdown_reason == list.shutdown_reason,
          "shutdown fields");
    CHECK(back.requests.size() == list.requests.size(), "%zu requests, want %zu",
          back.requests.size(), list.requests.size());
    for (size_t i = 0; i < back.requests.size() && i < list.requests.size(); ++i) {
      CHECK(SameRequest(back.requests[i], list.requests[i]), "request %zu changed", i);
    }
    CHECK(Serialize(back) == bytes, "serializing the copy gives other bytes");
  }
}

void TestResponseListRoundTrip() {
  for (const ResponseList& list : {OddResponseList(), ResponseList()}) {
    const std::vector<uint8_t> bytes = Serialize(list);
    const ResponseList back = DeserializeResponseList(bytes.data(), bytes.size());
    CHECK(back.shutdown == list.shutdown && back.shutdown_ranks == list.shutdown_ranks &&
              back.shutdown_reasons == list.shutdown_reasons,
          "shutdown fields");
    CHECK(back.invalidated == list.invalidated, "invalidated names");
    CHECK(back.stall_error == list.stall_error, "stall error");
    CHECK(!back.idle, "idle is not sent");
    CHECK(back.responses.size() == list.responses.size(), "%zu responses, want %zu",
          back.responses.size(), list.responses.size());
    for (size_t i = 0; i < back.responses.size() && i < list.responses.size(); ++i) {
      CHECK(SameResponse(back.responses[i], list.responses[i]), "response %zu changed", i);
    }
    CHECK(Serialize(back) == bytes, "serializing the copy gives other bytes");
  }
}

template <typename F>
void CheckEveryTruncationThrows(const std::vector<uint8_t>& bytes, F deserialize, const char* what) {
  int wrong = 0;
  for (size_t n = 0; n < bytes.size(); n += (n < 4096 ? 1 : 997)) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);  // exact size: ASan sees overreads
    try {
      deserialize(prefix.data(), prefix.size());
      if (++wrong <= 3) CHECK(false, "%s cut to %zu of %zu bytes parsed", what, n, bytes.size());
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("truncated") == std::string::npos && ++wrong <= 3) {
        CHECK(false, "%s cut to %zu bytes: %s", what, n, e.what());
      }
    }
  }
  CHECK(wrong == 0, "%s: %d truncations not refused", what, wrong);
}

void TestTruncatedMessagesThrow() {
  CheckEveryTruncationThrows(Serialize(OddRequestList()), DeserializeRequestList, "a request list");
  CheckEveryTruncationThrows(Serialize(OddResponseList()), DeserializeResponseList,
                             "a response list");
}

}  // namespace

int main() {
  return RunTests({
      {"request list round trip", TestRequestListRoundTrip},
      {"response list round trip", TestResponseListRoundTrip},
      {"truncated messages throw", TestTruncatedMessagesThrow},
  });
}

// Checks of csrc/negotiation/rank_agreement.h on one rank (an MPI singleton):
// the values, flags and outcomes each helper hands back, and the lowest
// dissenting rank. Several ranks agreeing (an init() that fails on one
// rank, the wire every rank picks) run in tests/test_reliability.py and
// tests/test_multihost_collectives.py.
#include <mpi.h>

#include <string>
#include <vector>

#include "check.h"
#include "negotiation/rank_agreement.h"

using namespace hvdlite;

namespace {

void TestShareRootValues() {
  int64_t ints[3] = {7, -1, 1LL << 40};
  CHECK(ShareRootValues(MPI_COMM_WORLD, ints, 3, "ints").ok(), "int64 shared");
  CHECK(ints[0] == 7 && ints[1] == -1 && ints[2] == (1LL << 40), "rank 0's own values stay");
  double reals[2] = {0.25, 1e300};
  CHECK(ShareRootValues(MPI_COMM_WORLD, reals, 2, "reals").ok() && reals[0] == 0.25 && reals[1] == 1e300,
        "doubles shared");
  char name[8] = "abc";
  CHECK(ShareRootValues(MPI_COMM_WORLD, name, 8, "a name").ok() && std::string(name) == "abc", "bytes shared");
}

void TestAllAgree() {
  std::vector<int> flags = {1, 0, 5};
  int dissent = -2;
  CHECK(AllAgree(MPI_COMM_WORLD, &flags, "flags", &dissent).ok(), "agreed");
  CHECK(flags == std::vector<int>({1, 0, 1}), "each flag as 0 or 1, false where a rank said no");
  CHECK(dissent == 0, "rank 0 said no to one: %d", dissent);
  flags = {1, 1};
  CHECK(AllAgree(MPI_COMM_WORLD, &flags, "flags", &dissent).ok() && dissent == -1, "no dissent: %d", dissent);
  CHECK(AllAgree(MPI_COMM_WORLD, true) && !AllAgree(MPI_COMM_WORLD, false), "one flag");
}

void TestAgreeOnStatus() {
  std::vector<std::string> errors;
  CHECK(AgreeOnStatus(MPI_COMM_WORLD, Status::OK(), &errors).ok(), "agreed on success");
  CHECK(errors.size() == 1 && errors[0].empty(), "no error on rank 0");
  CHECK(AgreeOnStatus(MPI_COMM_WORLD, Status::InvalidArgument("bad setting"), &errors).ok(), "agreed on failure");
  CHECK(errors.size() == 1 && errors[0] == "bad setting", "rank 0's error: '%s'", errors.empty() ? "" : errors[0].c_str());
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int failed = hvdlite_test::RunTests({
      {"share rank 0's values", TestShareRootValues},
      {"all agree", TestAllAgree},
      {"agree on a status", TestAgreeOnStatus},
  });
  MPI_Finalize();
  return failed;
}

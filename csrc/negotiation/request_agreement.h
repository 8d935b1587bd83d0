// The coordinator's check that every rank submitted a tensor the same way:
// the same operation, dtype, shape (or trailing dimensions, for the ops that
// concatenate along the first), reduction, scaling, compression, root and
// process-set arguments. Pure, so it is unit-tested without MPI
// (tests/cpp/test_controller.cc).
#pragma once

#include <string>
#include <vector>

#include "negotiation/message.h"

namespace hvdlite {

// The first field (in the order users fix them) whose value differs between
// `requests` (one per submitting rank, `rank` set), as the error every rank
// gets, naming each rank's value; "" when they agree.
std::string FindMismatch(const std::vector<Request>& requests);

}  // namespace hvdlite

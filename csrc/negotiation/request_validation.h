// What a rank can check about a request on its own, before it enqueues it
// (what must agree across ranks is the coordinator's: controller.cc). The
// checks form a table, each applying to the operations whose rules
// (op_rules.h) ask for it; an error names the tensor and says what to do.
#pragma once

#include "negotiation/message.h"
#include "common/status.h"

namespace hvdlite {

// Fills in what the caller may leave out: alltoall's equal splits.
Status CompleteRequest(Request* q, int set_size);

// InvalidArgument with a message for the first rule `q` breaks.
Status ValidateRequest(const Request& q, int set_size);

}  // namespace hvdlite

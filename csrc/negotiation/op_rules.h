// Which fields of a request matter for each operation: the one table that
// request validation (request_validation.cc) and the coordinator's checks
// across ranks (controller.cc) read, so a new operation is one row here.
#pragma once

#include "common/common.h"

namespace hvdlite {

struct OpRules {
  bool reduces = false;         // reduce op, scale factors and compression apply
  bool whole_shape = false;     // every rank's shape must be the same
  bool trailing_shape = false;  // all dimensions but the first must be the same
  bool needs_rows = false;      // needs at least one dimension
  bool has_root = false;        // root_rank applies (broadcast)
  bool has_splits = false;      // splits apply (alltoall)
};

inline const OpRules& RulesFor(OpType op) {
  //                                   reduces whole  trailing rows   root   splits
  static const OpRules kAllreduce     {true,   true,  false,   false, false, false};
  static const OpRules kAllgather     {false,  false, true,    true,  false, false};
  static const OpRules kBroadcast     {false,  true,  false,   false, true,  false};
  static const OpRules kAlltoall      {false,  false, true,    true,  false, true};
  static const OpRules kReducescatter {true,   true,  false,   true,  false, false};
  static const OpRules kControl{};  // barrier, join, process-set changes
  switch (op) {
    case OpType::kAllreduce: return kAllreduce;
    case OpType::kAllgather: return kAllgather;
    case OpType::kBroadcast: return kBroadcast;
    case OpType::kAlltoall: return kAlltoall;
    case OpType::kReducescatter: return kReducescatter;
    default: return kControl;
  }
}

}  // namespace hvdlite

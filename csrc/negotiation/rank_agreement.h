// The few ways ranks come to agree while the engine sets up, before any
// transport exists (over the engine's MPI communicator): take rank 0's
// values, keep a wish only where every rank has it, and learn every rank's
// outcome. Whatever a rank's environment says, the ranks must then make the
// same choices (a setting that decides what goes on the wire, which wire),
// or they wait for each other forever. Negotiation of tensors is elsewhere
// (request_agreement.h, controller.h).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

// `values` (`count` of them) become rank 0's on every rank. `what` names
// them in the error ("the engine settings").
Status ShareRootValues(MPI_Comm comm, int64_t* values, int count, const char* what);
Status ShareRootValues(MPI_Comm comm, double* values, int count, const char* what);
Status ShareRootValues(MPI_Comm comm, char* values, int count, const char* what);

// Each flag stays true only where it is true on every rank (an AND per
// flag). `first_dissent`, when given, receives the lowest rank that had a
// flag false, -1 when none did.
Status AllAgree(MPI_Comm comm, std::vector<int>* flags, const char* what, int* first_dissent = nullptr);
// One flag; false also when the agreement itself fails.
bool AllAgree(MPI_Comm comm, bool mine);

// Every rank's outcome, for all to see: `errors` receives each rank's error
// message by rank ("" where it succeeded).
Status AgreeOnStatus(MPI_Comm comm, const Status& local, std::vector<std::string>* errors);

}  // namespace hvdlite

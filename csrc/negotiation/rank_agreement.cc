#include "negotiation/rank_agreement.h"

namespace hvdlite {

namespace {

Status ShareRoot(MPI_Comm comm, void* values, int count, MPI_Datatype type, const char* what) {
  if (MPI_Bcast(values, count, type, 0, comm) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, std::string("MPI_Bcast of ") + what + " failed");
  }
  return Status::OK();
}

}  // namespace

Status ShareRootValues(MPI_Comm comm, int64_t* values, int count, const char* what) {
  return ShareRoot(comm, values, count, MPI_INT64_T, what);
}

Status ShareRootValues(MPI_Comm comm, double* values, int count, const char* what) {
  return ShareRoot(comm, values, count, MPI_DOUBLE, what);
}

Status ShareRootValues(MPI_Comm comm, char* values, int count, const char* what) {
  return ShareRoot(comm, values, count, MPI_CHAR, what);
}

Status AllAgree(MPI_Comm comm, std::vector<int>* flags, const char* what, int* first_dissent) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // One minimum does both: the flags (0 anywhere makes 0), and the lowest
  // rank with a 0 (the others say `size`).
  std::vector<int> v;
  bool all_mine = true;
  for (int& f : *flags) {
    f = f != 0;
    all_mine = all_mine && f;
    v.push_back(f);
  }
  v.push_back(all_mine ? size : rank);
  if (MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, std::string("MPI_Allreduce of ") + what + " failed");
  }
  for (size_t i = 0; i < flags->size(); ++i) (*flags)[i] = v[i];
  if (first_dissent) *first_dissent = v.back() == size ? -1 : v.back();
  return Status::OK();
}

bool AllAgree(MPI_Comm comm, bool mine) {
  std::vector<int> flags = {mine ? 1 : 0};
  return AllAgree(comm, &flags, "a yes or no").ok() && flags[0] != 0;
}

Status AgreeOnStatus(MPI_Comm comm, const Status& local, std::vector<std::string>* errors) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::string mine = local.ok() ? std::string() : local.message();
  int my_len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size));
  if (MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Allgather of the ranks' outcomes failed");
  }
  std::vector<int> displs(static_cast<size_t>(size));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[static_cast<size_t>(r)] = total;
    total += lens[static_cast<size_t>(r)];
  }
  errors->assign(static_cast<size_t>(size), std::string());
  if (total == 0) return Status::OK();  // everyone succeeded: one collective only
  std::vector<char> text(static_cast<size_t>(total));
  if (MPI_Allgatherv(mine.data(), my_len, MPI_CHAR, text.data(), lens.data(), displs.data(), MPI_CHAR, comm) !=
      MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Allgatherv of the ranks' errors failed");
  }
  for (int r = 0; r < size; ++r) {
    (*errors)[static_cast<size_t>(r)].assign(text.data() + displs[static_cast<size_t>(r)],
                                             static_cast<size_t>(lens[static_cast<size_t>(r)]));
  }
  return Status::OK();
}

}  // namespace hvdlite

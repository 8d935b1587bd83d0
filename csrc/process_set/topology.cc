#include "process_set/topology.h"

#include <algorithm>
#include <string>

namespace hvdlite {

bool Topology::OneHost(const std::vector<int32_t>& ranks) const {
  for (int32_t r : ranks) {
    if (host_of_rank.at(static_cast<size_t>(r)) != host_of_rank.at(static_cast<size_t>(ranks.at(0)))) {
      return false;
    }
  }
  return true;
}

std::vector<int> Topology::HostsOf(const std::vector<int32_t>& ranks) const {
  std::vector<int> hosts;
  for (int32_t r : ranks) hosts.push_back(host_of_rank.at(static_cast<size_t>(r)));
  return hosts;
}

Status DiscoverTopology(MPI_Comm comm, Topology* out) {
  Topology t;
  MPI_Comm_rank(comm, &t.rank);
  MPI_Comm_size(comm, &t.size);
  constexpr int kNameLen = MPI_MAX_PROCESSOR_NAME;
  std::vector<char> names(static_cast<size_t>(kNameLen) * t.size, '\0');
  std::vector<char> mine(kNameLen, '\0');
  int len = 0;
  MPI_Get_processor_name(mine.data(), &len);
  if (MPI_Allgather(mine.data(), kNameLen, MPI_CHAR, names.data(), kNameLen, MPI_CHAR, comm) !=
      MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Allgather of host names failed");
  }
  auto host_of = [&](int r) { return std::string(names.data() + static_cast<size_t>(r) * kNameLen); };
  std::vector<int> local_rank_of(t.size);
  std::vector<std::string> hosts;
  t.host_of_rank.assign(t.size, 0);
  for (int r = 0; r < t.size; ++r) {
    int same = 0;
    for (int p = 0; p < r; ++p) same += host_of(p) == host_of(r);
    local_rank_of[r] = same;
    auto h = std::find(hosts.begin(), hosts.end(), host_of(r));
    t.host_of_rank[r] = static_cast<int>(h - hosts.begin());
    if (h == hosts.end()) hosts.push_back(host_of(r));
  }
  const int me = t.rank;
  t.local_rank = local_rank_of[me];
  t.local_size = 0;
  t.cross_rank = 0;
  t.cross_size = 0;
  for (int r = 0; r < t.size; ++r) {
    if (host_of(r) == host_of(me)) ++t.local_size;
    if (local_rank_of[r] == local_rank_of[me]) {
      if (r < me) ++t.cross_rank;
      ++t.cross_size;
    }
  }
  *out = std::move(t);
  return Status::OK();
}

}  // namespace hvdlite

#include "process_set/process_set.h"

#include <algorithm>
#include <set>

namespace hvdlite {

ProcessSet::ProcessSet(int32_t id, std::vector<int32_t> ranks, MPI_Comm comm, const std::vector<int>& hosts,
                       const EngineOptions& options, EngineStats* stats,
                       const AbortSignal* abort)
    : id_(id), ranks_(std::move(ranks)), comm_(comm) {
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    const bool one_host = std::all_of(hosts.begin(), hosts.end(), [&](int h) { return h == hosts[0]; });
    // The wire is chosen once, here: shared memory when every member is on
    // this host (and it is not turned off), MPI otherwise; large allreduces
    // between hosts around the ring.
    ShmSetup shm;
    shm.options = options.shm;
    shm.wait = options.wait;
    shm.cache_capacity = options.cache_capacity;
    shm.stats = stats;
    shm.abort = abort;
    // Negotiation naps while its peers are behind only where every member
    // has a host to itself: where hosts have several members (the
    // hierarchical wires), the naps' late wake-ups cost the 2 x 2 train step
    // 15 % (bench/results/2026-12-07-ddp-fsdp2).
    const bool host_each = std::set<int>(hosts.begin(), hosts.end()).size() == hosts.size();
    auto mpi = std::make_unique<MpiTransport>(comm_, options.wait, options.wait.ForNegotiation(!one_host && host_each),
                                              abort);
    transport_ = ShmTransport::Create(std::move(mpi), one_host && options.shm.allreduce, shm);
    RingSetup ring;
    ring.options = options.ring;
    ring.hierarchical = options.hierarchical;
    ring.wait = options.wait;
    ring.stats = stats;
    ring.abort = abort;
    const bool want_ring = options.ring.allreduce == Choice::kOn ||
                           (options.ring.allreduce == Choice::kAuto && !one_host);
    transport_ = RingTransport::Create(std::move(transport_), comm_, hosts, want_ring, ring);
    controller_ = std::make_unique<Controller>(transport_.get(), options, stats);
  }
}

ProcessSet::~ProcessSet() {
  controller_.reset();
  transport_.reset();  // unmaps shared memory; uses the communicator (unless abandoned)
  if (comm_ != MPI_COMM_NULL && !abandoned_) MPI_Comm_free(&comm_);
}

void ProcessSet::Abandon() {
  if (abandoned_) return;
  abandoned_ = true;
  if (transport_) transport_->Abandon();
}

std::string ProcessSet::NextAutoName(OpType op) {
  std::lock_guard<std::mutex> lock(names_mutex_);
  int64_t n = auto_name_counters_[static_cast<size_t>(op)]++;
  return std::string(OpTypeName(op)) + ".noname." + std::to_string(n);
}

int64_t AutoNameCounter(OpType op, const std::string& name) {
  const std::string prefix = std::string(OpTypeName(op)) + ".noname.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoll(digits);
}

void ProcessSet::SkipAutoName(OpType op, const std::string& name) {
  const int64_t n = AutoNameCounter(op, name);
  if (n < 0) return;
  std::lock_guard<std::mutex> lock(names_mutex_);
  int64_t& counter = auto_name_counters_[static_cast<size_t>(op)];
  counter = std::max(counter, n + 1);
}

void ProcessSetTable::Add(std::shared_ptr<ProcessSet> set) {
  std::lock_guard<std::mutex> lock(mutex_);
  sets_.push_back(std::move(set));
}

std::shared_ptr<ProcessSet> ProcessSetTable::Get(int32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& s : sets_) {
    if (s->id() == id) return s;
  }
  return nullptr;
}

std::shared_ptr<ProcessSet> ProcessSetTable::Remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(sets_.begin(), sets_.end(), [id](const auto& s) { return s->id() == id; });
  if (it == sets_.end()) return nullptr;
  auto set = *it;
  sets_.erase(it);
  return set;
}

std::vector<std::shared_ptr<ProcessSet>> ProcessSetTable::All() {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_;
}

std::vector<int32_t> ProcessSetTable::Ids() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int32_t> ids;
  for (auto& s : sets_) ids.push_back(s->id());
  return ids;
}

int32_t ProcessSetTable::NextId() {
  // The lowest free id, as Horovod assigns them: a removed set's id is reused.
  // Every rank holds the same table, so every rank picks the same id.
  std::lock_guard<std::mutex> lock(mutex_);
  int32_t id = 0;
  while (std::any_of(sets_.begin(), sets_.end(), [id](const auto& s) { return s->id() == id; })) ++id;
  return id;
}

}  // namespace hvdlite

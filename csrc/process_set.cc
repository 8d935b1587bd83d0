#include "process_set.h"

#include <algorithm>

namespace hvdlite {

ProcessSet::ProcessSet(int32_t id, std::vector<int32_t> ranks, MPI_Comm comm, bool one_host,
                       const EngineOptions& options, EngineStats* stats,
                       const std::atomic<bool>* abort)
    : id_(id), ranks_(std::move(ranks)), comm_(comm) {
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    mpi_ = std::make_unique<MpiCollectives>(comm_, options.wait, abort);
    shm_ = ShmCollectives::Create(comm_, one_host && options.shm_allreduce, options, abort);
    controller_ = std::make_unique<Controller>(mpi_.get(), shm_.get(), options, stats);
  }
}

ProcessSet::~ProcessSet() {
  shm_.reset();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string ProcessSet::NextAutoName(OpType op) {
  std::lock_guard<std::mutex> lock(names_mutex_);
  int64_t n = auto_name_counters_.at(static_cast<size_t>(op))++;
  return std::string(OpTypeName(op)) + ".noname." + std::to_string(n);
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
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_++;
}

}  // namespace hvdlite

#include "engine/tensor_queue.h"

namespace hvdlite {

Status TensorQueue::Add(TensorEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return closed_reason_;
  const std::string& name = entry.request.name;
  if (entries_.count(name)) {
    return Status::InvalidArgument(
        "a tensor named '" + name + "' is already in flight (" +
        OpTypeName(entries_[name].request.op) +
        "); wait for its handle before reusing the name, or give each call a unique name");
  }
  new_names_.push_back(name);
  entries_.emplace(name, std::move(entry));
  return Status::OK();
}

std::vector<Request> TensorQueue::PopNewRequests() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Copied here, on the engine thread, rather than at Add on the caller's.
  std::vector<Request> out;
  out.reserve(new_names_.size());
  for (const auto& name : new_names_) {
    auto it = entries_.find(name);
    if (it != entries_.end()) out.push_back(it->second.request);
  }
  new_names_.clear();
  return out;
}

bool TensorQueue::Take(const std::string& name, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return false;
  *out = std::move(it->second);
  entries_.erase(it);
  return true;
}

std::vector<TensorEntry> TensorQueue::Close(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  closed_reason_ = reason;
  std::vector<TensorEntry> out;
  out.reserve(entries_.size());
  for (auto& kv : entries_) out.push_back(std::move(kv.second));
  entries_.clear();
  new_names_.clear();
  return out;
}

size_t TensorQueue::InFlight() {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace hvdlite

#include "engine/work.h"

#include <chrono>
#include <cstdlib>

namespace hvdlite {

void* AllocateAligned(size_t bytes) {
  constexpr size_t kAlign = 64;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  return std::aligned_alloc(kAlign, rounded);
}

void FreeAligned(void* p) { std::free(p); }

OutputBuffer::~OutputBuffer() { FreeAligned(data_); }

bool OutputBuffer::Allocate(size_t bytes) {
  FreeAligned(data_);
  data_ = AllocateAligned(bytes);
  bytes_ = data_ ? bytes : 0;
  return data_ != nullptr;
}

void* OutputBuffer::Release() {
  void* p = data_;
  data_ = nullptr;
  bytes_ = 0;
  return p;
}

bool Work::IsCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Work::Wait(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout_seconds < 0) {
    done_cv_.wait(lock, [this] { return completed_; });
    return true;
  }
  return done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                           [this] { return completed_; });
}

Status Work::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

void Work::Finish() { Complete(Status::OK()); }

void Work::Fail(const Status& status) { Complete(status); }

void Work::OnCompletion(std::function<void()> listener) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      listeners_.push_back(std::move(listener));
      return;
    }
  }
  listener();
}

void Work::Complete(const Status& status) {
  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
    completed_ = true;
    status_ = status;
    listeners.swap(listeners_);
  }
  done_cv_.notify_all();
  for (auto& listener : listeners) listener();
}

}  // namespace hvdlite

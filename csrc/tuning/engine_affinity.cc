#include "tuning/engine_affinity.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace hvdlite {

namespace {

// How often a waiting thread looks at the pinned engine's run-queue delay
// (and once more when the wait ends), and how much of that stretch the
// engine may spend queued before its pin is released: the waiting thread has
// left the core, so the engine is queued only while something else runs there.
constexpr double kCheckSeconds = 0.02;
constexpr double kQueuedShare = 0.5;
// Shorter stretches say too little either way: the engine waits behind the
// waiting thread for a moment as that thread goes to sleep and again as it
// wakes up with the results.
constexpr double kMinJudgedSeconds = 0.005;
// Releases in a row (no unhindered pinned wait between) before pinning stops.
constexpr int kStrikes = 3;

}  // namespace

void EngineAffinity::Start() {
  std::lock_guard<std::mutex> lock(mutex_);
  thread_ = pthread_self();
  tid_ = static_cast<pid_t>(syscall(SYS_gettid));
  CPU_ZERO(&cores_);
  running_ = pthread_getaffinity_np(thread_, sizeof(cores_), &cores_) == 0;
  // Without the scheduler's statistics a starved pin could not be noticed:
  // then the engine is never pinned.
  if (RunQueueDelayNs() < 0) running_ = false;
}

void EngineAffinity::Stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = false;
  following_.store(false, std::memory_order_relaxed);
  stats_->engine_follows_waiter.store(0, std::memory_order_relaxed);
}

void EngineAffinity::StartFollowing(bool measured) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!running_) return;
  measured_.store(measured, std::memory_order_relaxed);
  unpinned_arm_.store(measured && trial_.arm() == AffinityTrial::Arm::kUnpinned, std::memory_order_relaxed);
  following_.store(true, std::memory_order_relaxed);
  stats_->engine_follows_waiter.store(1, std::memory_order_relaxed);
}

void EngineAffinity::PinTo(int cpu) {
  if (cpu < 0 || held_off_.load(std::memory_order_relaxed) || unpinned_arm_.load(std::memory_order_relaxed) ||
      pinned_.load(std::memory_order_relaxed) == cpu) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // A core outside the engine's own affinity (the user's binding) is left alone.
  // Checked again: a step may have started the unpinned arm meanwhile.
  if (!running_ || !following() || !CPU_ISSET(cpu, &cores_) || pinned_.load(std::memory_order_relaxed) == cpu ||
      unpinned_arm_.load(std::memory_order_relaxed)) {
    return;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (pthread_setaffinity_np(thread_, sizeof(one), &one) != 0) {
    // A cpuset that refuses the change will refuse the next one too.
    following_.store(false, std::memory_order_relaxed);
    stats_->engine_follows_waiter.store(0, std::memory_order_relaxed);
    return;
  }
  pinned_.store(cpu, std::memory_order_relaxed);
  stats_->Add(stats_->engine_affinity_pins, 1);
}

void EngineAffinity::Unpin() {
  if (running_ && pinned_.load(std::memory_order_relaxed) >= 0) {
    pthread_setaffinity_np(thread_, sizeof(cores_), &cores_);
  }
  pinned_.store(-1, std::memory_order_relaxed);
}

void EngineAffinity::Release() {
  std::lock_guard<std::mutex> lock(mutex_);
  held_off_.store(true, std::memory_order_relaxed);
  Unpin();
  stats_->Add(stats_->engine_affinity_releases, 1);
  if (++strikes_ >= kStrikes) {
    following_.store(false, std::memory_order_relaxed);
    stats_->engine_follows_waiter.store(0, std::memory_order_relaxed);
  }
}

int64_t EngineAffinity::RunQueueDelayNs() const {
  // "<on-cpu ns> <run-queue ns> <slices>" (Documentation/scheduler/sched-stats).
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", static_cast<int>(tid_));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[96];
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  unsigned long long on_cpu = 0, queued = 0;
  if (std::sscanf(text, "%llu %llu", &on_cpu, &queued) != 2) return -1;
  return static_cast<int64_t>(queued);
}

void EngineAffinity::StepStarted() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const bool first = step_start_ == std::chrono::steady_clock::time_point();
  const double seconds = std::chrono::duration<double>(now - step_start_).count();
  step_start_ = now;
  if (first || !running_) return;
  const auto before = trial_.arm();
  const auto arm = trial_.Record(seconds);
  stats_->engine_affinity_chose_pinned.store(trial_.chose_pinned(), std::memory_order_relaxed);
  stats_->engine_affinity_chose_unpinned.store(trial_.chose_unpinned(), std::memory_order_relaxed);
  if (arm == before) return;
  // A pinned arm pins at the next round or wait; an unpinned one lets go now.
  unpinned_arm_.store(arm == AffinityTrial::Arm::kUnpinned, std::memory_order_relaxed);
  if (arm == AffinityTrial::Arm::kUnpinned) Unpin();
}

bool EngineAffinity::Wait(Work& work, double timeout_seconds) {
  if (!following()) return work.Wait(timeout_seconds);
  if (measured_.load(std::memory_order_relaxed) && !waited_since_work_.load(std::memory_order_relaxed)) {
    waited_since_work_.store(true, std::memory_order_relaxed);
  }
  if (work.IsCompleted()) return work.Wait(timeout_seconds);
  if (!waited_.load(std::memory_order_relaxed)) waited_.store(true, std::memory_order_relaxed);
  PinTo(sched_getcpu());
  if (pinned_.load(std::memory_order_relaxed) < 0) return work.Wait(timeout_seconds);

  // The pinned engine is judged in windows of kCheckSeconds (and at the end
  // of the wait): queued for most of one, it was kept from its core.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  // What is left of the caller's timeout (< 0: none).
  auto rest = [&] { return timeout_seconds < 0 ? -1.0 : std::max(0.0, timeout_seconds - since(start)); };
  auto window = start;
  int64_t queued = RunQueueDelayNs();
  while (true) {
    const bool done = work.Wait(timeout_seconds < 0 ? kCheckSeconds : std::min(kCheckSeconds, rest()));
    const double judged = since(window);
    const int64_t now = RunQueueDelayNs();
    if (pinned_.load(std::memory_order_relaxed) < 0) {  // released by another waiting thread
      return done || work.Wait(rest());
    }
    if (judged >= kMinJudgedSeconds && now >= 0 && queued >= 0) {
      if (static_cast<double>(now - queued) > kQueuedShare * judged * 1e9) {
        Release();
        return done || work.Wait(rest());
      }
      if (done) {
        std::lock_guard<std::mutex> lock(mutex_);
        strikes_ = 0;  // the pinned engine had its core
      }
    }
    if (done) return true;
    if (rest() == 0.0) return false;
    window = Clock::now();
    queued = now;
  }
}

}  // namespace hvdlite

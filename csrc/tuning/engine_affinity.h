// Which cores the engine thread runs on.
//
// Where the engine runs at idle priority (the training threads fill the
// host's cores, engine_priority.h), it works when a core falls free: mostly
// the one its training thread leaves when it blocks on the results, but the
// kernel also moves it to other ranks' cores, away from the gradients the
// training thread just wrote into its own core's cache, and the optimizer
// then reads the results from another core's cache. Pinned to the core of
// the thread that submits and waits, the one-host train step was faster in
// most interleaved runs (docs/engine.md#engine-thread-affinity).
//
// So the engine follows that thread's core: a thread that starts to wait
// moves the pin at once, and after a submission the engine moves it itself
// at its next round (only once a thread has waited, so that a wait can
// watch the pin). A pin must never cost more than it saves: when the
// engine, pinned, waits for a core that something else holds (another
// program, a rank that moved there), the waiting thread sees it in the
// engine's run-queue delay, gives it all its cores back until new work is
// submitted, and after kStrikes such waits in a row stops pinning for good.
// A late peer leaves the engine asleep, not queued, and changes nothing.
//
// Whether the pin pays at all depends on the host (affinity_trial.h): with
// HVDLITE_ENGINE_AFFINITY=auto the engine measures the training steps with
// and without it and keeps the faster, trying again now and then.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "tuning/affinity_trial.h"
#include "engine/engine_stats.h"
#include "engine/work.h"

namespace hvdlite {

class EngineAffinity {
 public:
  explicit EngineAffinity(EngineStats* stats) : stats_(stats) {}

  // On the engine thread, first thing: remembers it and the cores it may use.
  void Start();
  // On the engine thread as it ends; later waits only wait.
  void Stop();

  // From now on waits pin the engine (HVDLITE_ENGINE_AFFINITY=follow, or auto
  // with the idle priority); only a starved pin (Release) turns it off again.
  // `measured`: only while the training steps measure faster pinned
  // (AffinityTrial), as auto does.
  void StartFollowing(bool measured);
  bool following() const { return following_.load(std::memory_order_relaxed); }

  // Work::Wait, keeping the engine on the caller's core meanwhile.
  bool Wait(Work& work, double timeout_seconds);
  // A tensor was submitted, from the calling thread: the engine follows that
  // thread's core (from its next round) once a thread has waited for it, and
  // a pin released by a wait may be taken again.
  void NewWork() {
    if (!following()) return;
    // The first submission after a wait starts a training step.
    if (measured_.load(std::memory_order_relaxed) && waited_since_work_.load(std::memory_order_relaxed) &&
        waited_since_work_.exchange(false, std::memory_order_relaxed)) {
      StepStarted();
    }
    if (held_off_.load(std::memory_order_relaxed)) held_off_.store(false, std::memory_order_relaxed);
    const int cpu = sched_getcpu();
    if (submitter_.load(std::memory_order_relaxed) != cpu) submitter_.store(cpu, std::memory_order_relaxed);
  }
  // On the engine thread, at the start of each round.
  void Apply() {
    if (!following() || !waited_.load(std::memory_order_relaxed)) return;
    const int cpu = submitter_.load(std::memory_order_relaxed);
    if (cpu != pinned_.load(std::memory_order_relaxed)) PinTo(cpu);
  }

 private:
  void PinTo(int cpu);
  // Gives the engine its cores back; counts a strike.
  void Release();
  // Restores the engine thread's own mask; under mutex_.
  void Unpin();
  // A step began: the trial records the one that ended and picks the arm.
  void StepStarted();
  // Nanoseconds the engine thread has spent runnable but not running.
  int64_t RunQueueDelayNs() const;

  EngineStats* stats_;
  std::atomic<bool> following_{false};
  std::atomic<bool> held_off_{false};  // released; no pin until NewWork
  // A thread has waited here: only then is there a wait that can notice a
  // pinned engine kept from its core (a TensorFlow op completes by callback).
  std::atomic<bool> waited_{false};
  std::atomic<int> submitter_{-1};     // the core the last tensor was submitted from
  std::atomic<int> pinned_{-1};        // the core the engine is pinned to, or -1
  std::atomic<bool> measured_{false};           // auto: pinned only in the trial's pinned arm
  std::atomic<bool> waited_since_work_{false};  // the next submission starts a step
  std::atomic<bool> unpinned_arm_{false};       // the trial's current arm is unpinned

  std::mutex mutex_;  // the rest, and every change of the thread's affinity
  bool running_ = false;
  pthread_t thread_{};
  pid_t tid_ = 0;
  cpu_set_t cores_{};  // the engine thread's own affinity, restored on release
  int strikes_ = 0;
  AffinityTrial trial_;
  std::chrono::steady_clock::time_point step_start_{};  // none yet: the epoch
};

}  // namespace hvdlite

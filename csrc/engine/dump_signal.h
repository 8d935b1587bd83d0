// SIGUSR1 asks a running engine for a flight-recorder dump (hvdrun's rank
// wrapper forwards it to the rank). The handler only writes a byte to a pipe;
// a small thread of its own reads it and runs the dump, so a dump works while
// the engine thread is stuck in a wait and while Python holds or waits for
// the GIL.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace hvdlite {

class DumpSignal {
 public:
  DumpSignal() = default;
  DumpSignal(const DumpSignal&) = delete;
  DumpSignal& operator=(const DumpSignal&) = delete;
  ~DumpSignal() { Stop(); }

  // Installs the handler (unless another engine of this process has it);
  // `dump` then runs on this object's thread once per signal. A handler that
  // was there already (MPICH installs one) still runs after it. Returns
  // whether it did.
  bool Start(std::function<void()> dump);
  // Puts back the previous action and joins the thread. Safe to call twice.
  void Stop();

 private:
  std::function<void()> dump_;
  std::thread thread_;
  int read_fd_ = -1;
  int write_fd_ = -1;
  bool installed_ = false;
  std::atomic<bool> quit_{false};
};

}  // namespace hvdlite

#include "common/keep_until_exit.h"

#include <mutex>
#include <vector>

namespace hvdlite {

void KeepPointerUntilExit(std::shared_ptr<void> memory) {
  static std::mutex* mutex = new std::mutex();
  // Never destroyed: static destruction at exit may run after MPI_Finalize,
  // and the memory must outlive every MPI call.
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(*mutex);
  kept->push_back(std::move(memory));
}

}  // namespace hvdlite

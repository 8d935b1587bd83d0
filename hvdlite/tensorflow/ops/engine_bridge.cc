#include "engine_bridge.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace hvdlite_tf {
namespace {

// Table order = hvdlite_tf_api_names() order.
#define HVDLITE_TF_API(X) \
  X(enqueue, hvd_enqueue) \
  X(on_completion, hvd_on_completion) \
  X(handle_error, hvd_handle_error) \
  X(handle_take_output, hvd_handle_take_output) \
  X(handle_received_splits, hvd_handle_received_splits) \
  X(handle_value, hvd_handle_value) \
  X(release, hvd_release) \
  X(free_output, hvd_free_output) \
  X(last_error, hvd_last_error)

EngineApi g_api;
std::atomic<bool> g_bound{false};

// Continuations of completed handles, run in completion order by one thread
// of this library: the engine thread only queues them (it must not block or
// call back into the engine), and no TensorFlow thread ever waits.
class CompletionThread {
 public:
  static CompletionThread& Get() {
    // Never destroyed: the thread may still wait on it while the process exits.
    static CompletionThread* instance = new CompletionThread();
    return *instance;
  }

  static void Notify(int64_t handle, void* arg) {
    Get().Push(handle, static_cast<Continuation*>(arg));
  }

  void Push(int64_t handle, Continuation* then) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(handle, then);
    }
    cv_.notify_one();
  }

 private:
  CompletionThread() {
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    for (;;) {
      std::pair<int64_t, Continuation*> item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        item = queue_.front();
        queue_.pop_front();
      }
      (*item.second)(item.first);
      delete item.second;
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, Continuation*>> queue_;
};

}  // namespace

const EngineApi* Api() { return g_bound.load(std::memory_order_acquire) ? &g_api : nullptr; }

int64_t Submit(const hvd_tensor_request& request, Continuation then, std::string* error) {
  const int64_t handle = g_api.enqueue(&request);
  if (handle <= 0) {
    *error = g_api.last_error();
    return handle < 0 ? handle : -HVD_ERROR_INTERNAL;  // the engine never returns 0
  }
  auto* pending = new Continuation(std::move(then));
  auto& thread = CompletionThread::Get();
  if (g_api.on_completion(handle, &CompletionThread::Notify, pending) != 0) {
    // Only if the handle vanished at once (a concurrent shutdown and re-init):
    // the continuation then reads that outcome from the engine.
    thread.Push(handle, pending);
  }
  return handle;
}

}  // namespace hvdlite_tf

extern "C" {

const char* hvdlite_tf_api_names(void) {
#define HVDLITE_TF_NAME(field, function) #function ","
  static const char* names = HVDLITE_TF_API(HVDLITE_TF_NAME);
#undef HVDLITE_TF_NAME
  return names;
}

int hvdlite_tf_bind(const uint64_t* addresses, int count) {
  using hvdlite_tf::g_api;
  int expected = 0;
#define HVDLITE_TF_COUNT(field, function) ++expected;
  HVDLITE_TF_API(HVDLITE_TF_COUNT)
#undef HVDLITE_TF_COUNT
  if (addresses == nullptr || count != expected) return -1;
  for (int i = 0; i < count; ++i) {
    if (addresses[i] == 0) return -1;
  }
  int i = 0;
#define HVDLITE_TF_SET(field, function) \
  g_api.field = reinterpret_cast<decltype(g_api.field)>(static_cast<uintptr_t>(addresses[i++]));
  HVDLITE_TF_API(HVDLITE_TF_SET)
#undef HVDLITE_TF_SET
  hvdlite_tf::g_bound.store(true, std::memory_order_release);
  return 0;
}

}  // extern "C"

// The op library's link to hvdlite's engine.
//
// The op library's sources live with the TensorFlow adapter rather than in
// csrc/: csrc/ is the framework-free engine, while these files are installed
// with the package and compiled against whichever TensorFlow is installed, at
// pip install time or on first import (hvdlite/tensorflow/op_library.py).
//
// The library does not link the engine (or MPI): hvdlite.tensorflow hands it
// the addresses of the engine's C API functions once, through
// hvdlite_tf_bind(), so TensorFlow's kernels and the Python API share the one
// engine of the process. Kernels submit tensors with Submit() and never wait:
// the engine notifies the bridge when a handle completes (hvd_on_completion),
// and the bridge's completion thread runs the kernel's continuation, which
// reads the outcome, fills the outputs and calls TensorFlow's done().
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "c_api.h"

namespace hvdlite_tf {

// The C API entry points the kernels use (csrc/api/c_api.h documents them).
struct EngineApi {
  decltype(&hvd_enqueue) enqueue = nullptr;
  decltype(&hvd_on_completion) on_completion = nullptr;
  decltype(&hvd_handle_error) handle_error = nullptr;
  decltype(&hvd_handle_take_output) handle_take_output = nullptr;
  decltype(&hvd_handle_received_splits) handle_received_splits = nullptr;
  decltype(&hvd_handle_value) handle_value = nullptr;
  decltype(&hvd_release) release = nullptr;
  decltype(&hvd_free_output) free_output = nullptr;
  decltype(&hvd_last_error) last_error = nullptr;
};

// The bound entry points, or nullptr before hvdlite_tf_bind().
const EngineApi* Api();

// Runs on the completion thread once the handle has completed; it owns the
// handle and must release it.
using Continuation = std::function<void(int64_t handle)>;

// Enqueues `request`. On success returns the handle (> 0) and `then` will
// run on the completion thread. On failure returns the negated ErrorKind,
// sets *error, and `then` never runs.
int64_t Submit(const hvd_tensor_request& request, Continuation then, std::string* error);

}  // namespace hvdlite_tf

extern "C" {
// Comma-separated names of the C API functions hvdlite_tf_bind() expects, in order.
const char* hvdlite_tf_api_names(void);
// addresses[i] is the address of the i-th function of hvdlite_tf_api_names().
// Returns 0, or -1 when count is wrong or an address is 0.
int hvdlite_tf_bind(const uint64_t* addresses, int count);
}

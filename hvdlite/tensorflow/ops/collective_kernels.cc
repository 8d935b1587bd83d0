// CPU kernels of hvdlite's TensorFlow ops (op_defs.cc).
//
// Every kernel is an AsyncOpKernel: ComputeAsync validates, allocates the
// outputs whose shape is known (allreduce, broadcast), submits one engine
// request per tensor and returns at once. When the engine has completed them
// all, the bridge's completion thread fills the outputs the engine allocated
// (allgather, alltoall, reducescatter: copied into TensorFlow tensors), sets
// the TensorFlow status that matches the engine's ErrorKind and calls done().
// No TensorFlow thread waits for other ranks, so independent collectives of
// a graph may start in any order on any number of inter-op threads.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine_bridge.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace hvdlite_tf {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::DataType;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// Engine ErrorKind -> TensorFlow status, the classes Horovod's ops raise:
// bad input InvalidArgument, ranks disagreeing FailedPrecondition, a stopped
// engine Aborted. The errors of a lost peer also name hvdlite's Python class:
// hvd.elastic.run recognises a lost peer in a TensorFlow error by it.
Status EngineError(int kind, const std::string& message) {
  const std::string text = "hvdlite: " + message;
  switch (kind) {
    case HVD_ERROR_INVALID_ARGUMENT: return errors::InvalidArgument(text);
    case HVD_ERROR_MISMATCH: return errors::FailedPrecondition(text);
    case HVD_ERROR_NOT_INITIALIZED: return errors::FailedPrecondition(text);
    case HVD_ERROR_SHUTDOWN: return errors::Aborted("hvdlite: HvdliteShutdownError: " + message);
    case HVD_ERROR_STALL: return errors::Aborted(text);
    case HVD_ERROR_TIMEOUT: return errors::DeadlineExceeded("hvdlite: HvdliteTimeoutError: " + message);
    case HVD_ERROR_MPI: return errors::Unknown("hvdlite: MPIError: " + message);
    default: return errors::Internal(text);
  }
}

// The engine's DataType code of a TensorFlow dtype, -1 if none.
int32_t EngineDtype(DataType dtype) {
  switch (dtype) {
    case ::tensorflow::DT_UINT8: return HVD_DTYPE_UINT8;
    case ::tensorflow::DT_INT8: return HVD_DTYPE_INT8;
    case ::tensorflow::DT_INT32: return HVD_DTYPE_INT32;
    case ::tensorflow::DT_INT64: return HVD_DTYPE_INT64;
    case ::tensorflow::DT_HALF: return HVD_DTYPE_FLOAT16;
    case ::tensorflow::DT_FLOAT: return HVD_DTYPE_FLOAT32;
    case ::tensorflow::DT_DOUBLE: return HVD_DTYPE_FLOAT64;
    case ::tensorflow::DT_BFLOAT16: return HVD_DTYPE_BFLOAT16;
    case ::tensorflow::DT_BOOL: return HVD_DTYPE_BOOL;
    case ::tensorflow::DT_UINT16: return HVD_DTYPE_UINT16;
    case ::tensorflow::DT_INT16: return HVD_DTYPE_INT16;
    default: return -1;
  }
}

// One kernel invocation in flight: done() runs when the last of its engine
// requests has completed (or at once if none could be submitted).
class InFlight {
 public:
  InFlight(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done)
      : ctx_(ctx), done_(std::move(done)) {}

  OpKernelContext* ctx() const { return ctx_; }

  void Fail(const Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (status_.ok()) status_ = status;
  }

  bool failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !status_.ok();
  }

  void Add() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++pending_;
  }

  // Deletes this after done() when it was the last pending part.
  void PartDone() {
    Status status;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ > 0) return;
      status = status_;
    }
    if (!status.ok()) ctx_->SetStatus(status);
    auto done = std::move(done_);
    delete this;
    done();
  }

 private:
  OpKernelContext* ctx_;
  AsyncOpKernel::DoneCallback done_;
  std::mutex mutex_;
  int pending_ = 1;  // the submitting thread's own part, released after the last submit
  Status status_;
};

// One tensor's request; the vectors keep the shape and splits alive while
// the engine copies them.
struct Submission {
  hvd_tensor_request request{};
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;
  std::string name;
};

// The collective-level fields of the engine request, which Python's
// hvdlite.collectives built and mpi_ops.py passed as the op's attributes
// (attribute names: the request's, with Horovod's "_factor" and "_id"
// suffixes). Every tensor of the op shares them; the kernel adds what only
// the tensors say (dtype, shape, addresses, splits).
Status ReadRequestAttrs(OpKernelConstruction* c, hvd_tensor_request* r) {
  int64_t set = 0, reduce_op = HVD_REDUCE_SUM, code = 0, config = 0, root = 0;
  float pre = 1.f, post = 1.f, ratio = 0.f;
  bool error_feedback = false;
  TF_RETURN_IF_ERROR(c->GetAttr("process_set_id", &set));
  if (c->HasAttr("reduce_op")) {
    TF_RETURN_IF_ERROR(c->GetAttr("reduce_op", &reduce_op));
    TF_RETURN_IF_ERROR(c->GetAttr("prescale_factor", &pre));
    TF_RETURN_IF_ERROR(c->GetAttr("postscale_factor", &post));
    TF_RETURN_IF_ERROR(c->GetAttr("compression", &code));
    TF_RETURN_IF_ERROR(c->GetAttr("topk_ratio", &ratio));
    TF_RETURN_IF_ERROR(c->GetAttr("error_feedback", &error_feedback));
    TF_RETURN_IF_ERROR(c->GetAttr("compression_config", &config));
  }
  if (c->HasAttr("root_rank")) TF_RETURN_IF_ERROR(c->GetAttr("root_rank", &root));
  r->process_set = static_cast<int32_t>(set);
  r->reduce_op = static_cast<int32_t>(reduce_op);
  r->prescale = pre;
  r->postscale = post;
  r->compression = static_cast<int32_t>(code);
  r->topk_ratio = ratio;
  r->error_feedback = error_feedback ? 1 : 0;
  r->compression_config = static_cast<int32_t>(config);
  r->root_rank = static_cast<int32_t>(root);
  return Status();
}

// Shared by every kernel: the request's attributes, the per-tensor loop, and
// the completion path. Subclasses say how each tensor becomes a buffer
// (Prepare) and how its results reach the outputs (Collect).
class CollectiveKernel : public AsyncOpKernel {
 public:
  CollectiveKernel(OpKernelConstruction* c, int32_t op) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, ReadRequestAttrs(c, &base_));
    base_.op = op;
    if (c->HasAttr("tensor_names")) OP_REQUIRES_OK(c, c->GetAttr("tensor_names", &names_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const EngineApi* api = Api();
    OP_REQUIRES_ASYNC(ctx, api != nullptr,
                      errors::FailedPrecondition(
                          "hvdlite's TensorFlow ops are not connected to the engine; import "
                          "hvdlite.tensorflow and call hvdlite.tensorflow.init() first"),
                      done);
    const int n = tensors(ctx);
    OP_REQUIRES_ASYNC(ctx, names_.empty() || static_cast<int>(names_.size()) == n,
                      errors::InvalidArgument("hvdlite: ", names_.size(), " tensor names for ", n,
                                              " tensors"),
                      done);
    std::vector<Submission> subs(n);
    for (int i = 0; i < n; ++i) {
      Submission& s = subs[i];
      s.name = names_.empty() ? std::string() : names_[i];
      s.request = base_;
      s.request.name = s.name.c_str();
      OP_REQUIRES_OK_ASYNC(ctx, Prepare(ctx, i, &s), done);
      s.request.ndim = static_cast<int32_t>(s.shape.size());
      s.request.shape = s.shape.empty() ? nullptr : s.shape.data();
      s.request.splits = s.splits.empty() ? nullptr : s.splits.data();
      s.request.nsplits = static_cast<int32_t>(s.splits.size());
    }
    auto* flight = new InFlight(ctx, std::move(done));
    for (int i = 0; i < n && !flight->failed(); ++i) {
      flight->Add();
      std::string error;
      const int64_t handle = Submit(
          subs[i].request,
          [this, flight, i](int64_t h) { Complete(flight, i, h); }, &error);
      if (handle < 0) {
        // Later tensors are not submitted; those already submitted still
        // complete (their buffers stay in use until then).
        flight->Fail(EngineError(static_cast<int>(-handle), error));
        flight->PartDone();
      }
    }
    flight->PartDone();
  }

 protected:
  // How many engine requests this invocation makes.
  virtual int tensors(OpKernelContext* ctx) { return ctx->num_inputs(); }

  // Fills dtype, shape, input/output pointers and splits of tensor i.
  virtual Status Prepare(OpKernelContext* ctx, int i, Submission* s) = 0;

  // Moves a successful result into the outputs; nothing where the engine
  // wrote into TensorFlow's output.
  virtual Status Collect(OpKernelContext* ctx, int i, int64_t handle) { return Status(); }

  // Data type, shape and address of input i.
  static Status DescribeInput(OpKernelContext* ctx, int i, Submission* s) {
    const Tensor& t = ctx->input(i);
    s->request.dtype = EngineDtype(t.dtype());
    if (s->request.dtype < 0) {
      return errors::InvalidArgument("hvdlite: unsupported dtype ",
                                     ::tensorflow::DataTypeString(t.dtype()));
    }
    const auto dims = t.shape().dim_sizes();  // returned by value
    s->shape.assign(dims.begin(), dims.end());
    s->request.input = t.tensor_data().data();
    return Status();
  }

  // Copies the buffer the engine allocated into a new output `index`.
  static Status CopyEngineOutput(OpKernelContext* ctx, int index, int64_t handle) {
    const EngineApi* api = Api();
    void* data = nullptr;
    int64_t nbytes = 0;
    int64_t dims[32];
    const int ndim = api->handle_take_output(handle, &data, &nbytes, dims, 32);
    if (ndim < 0) return errors::Internal("hvdlite: ", api->last_error());
    std::unique_ptr<void, void (*)(void*)> owned(data, api->free_output);
    TensorShape shape;
    for (int d = 0; d < ndim; ++d) TF_RETURN_IF_ERROR(shape.AddDimWithStatus(dims[d]));
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &out));
    const size_t want = out->tensor_data().size();
    if (static_cast<size_t>(nbytes) < want) {
      return errors::Internal("hvdlite: the engine returned ", nbytes, " bytes for a result of ",
                              want, " bytes");
    }
    if (want > 0) std::memcpy(const_cast<char*>(out->tensor_data().data()), data, want);
    return Status();
  }

 private:
  // On the completion thread.
  void Complete(InFlight* flight, int i, int64_t handle) {
    const EngineApi* api = Api();
    char message[4096];
    const int kind = api->handle_error(handle, message, sizeof(message));
    if (kind != 0) {
      flight->Fail(EngineError(kind < 0 ? HVD_ERROR_INTERNAL : kind,
                               kind < 0 ? std::string(api->last_error()) : std::string(message)));
    } else {
      Status s = Collect(flight->ctx(), i, handle);
      if (!s.ok()) flight->Fail(s);
    }
    api->release(handle);
    flight->PartDone();
  }

  hvd_tensor_request base_{};
  std::vector<std::string> names_;
};

// Allreduce and broadcast: output i has input i's shape and the engine
// writes into it.
template <int32_t kOp>
class InPlaceShapeKernel : public CollectiveKernel {
 public:
  explicit InPlaceShapeKernel(OpKernelConstruction* c) : CollectiveKernel(c, kOp) {}

 protected:
  Status Prepare(OpKernelContext* ctx, int i, Submission* s) override {
    TF_RETURN_IF_ERROR(DescribeInput(ctx, i, s));
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(i, ctx->input(i).shape(), &out));
    s->request.output = const_cast<char*>(out->tensor_data().data());
    return Status();
  }
};

// Allgather and reducescatter: only the engine knows the output's rows; it
// allocates the result, copied into TensorFlow's output.
template <int32_t kOp>
class EngineOutputKernel : public CollectiveKernel {
 public:
  explicit EngineOutputKernel(OpKernelConstruction* c) : CollectiveKernel(c, kOp) {}

 protected:
  Status Prepare(OpKernelContext* ctx, int i, Submission* s) override {
    return DescribeInput(ctx, i, s);
  }

  Status Collect(OpKernelContext* ctx, int i, int64_t handle) override {
    return CopyEngineOutput(ctx, i, handle);
  }
};

using AllreduceKernel = InPlaceShapeKernel<HVD_OP_ALLREDUCE>;
using BroadcastKernel = InPlaceShapeKernel<HVD_OP_BROADCAST>;
using AllgatherKernel = EngineOutputKernel<HVD_OP_ALLGATHER>;
using ReducescatterKernel = EngineOutputKernel<HVD_OP_REDUCESCATTER>;

class AlltoallKernel : public CollectiveKernel {
 public:
  explicit AlltoallKernel(OpKernelConstruction* c) : CollectiveKernel(c, HVD_OP_ALLTOALL) {}

 protected:
  int tensors(OpKernelContext*) override { return 1; }

  Status Prepare(OpKernelContext* ctx, int i, Submission* s) override {
    TF_RETURN_IF_ERROR(DescribeInput(ctx, 0, s));
    const Tensor& splits = ctx->input(1);
    if (splits.dims() > 1) {
      return errors::InvalidArgument("hvdlite: alltoall splits must be a vector with one entry "
                                     "per rank, got shape ", splits.shape().DebugString());
    }
    const int64_t count = splits.NumElements();
    s->splits.resize(count);
    for (int64_t k = 0; k < count; ++k) {
      s->splits[k] = splits.dtype() == ::tensorflow::DT_INT32
                         ? static_cast<int64_t>(splits.flat<int32_t>()(k))
                         : static_cast<int64_t>(splits.flat<int64_t>()(k));
    }
    return Status();
  }

  Status Collect(OpKernelContext* ctx, int, int64_t handle) override {
    TF_RETURN_IF_ERROR(CopyEngineOutput(ctx, 0, handle));
    const EngineApi* api = Api();
    const int n = api->handle_received_splits(handle, nullptr, 0);
    if (n < 0) return errors::Internal("hvdlite: ", api->last_error());
    std::vector<int64_t> received(n);
    if (n > 0) api->handle_received_splits(handle, received.data(), n);
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &out));
    auto flat = out->flat<int32_t>();
    for (int k = 0; k < n; ++k) flat(k) = static_cast<int32_t>(received[k]);
    return Status();
  }
};

// Barrier and join: one request without data; join returns the last rank
// to join.
template <int32_t kOp>
class ControlKernel : public CollectiveKernel {
 public:
  explicit ControlKernel(OpKernelConstruction* c) : CollectiveKernel(c, kOp) {}

 protected:
  int tensors(OpKernelContext*) override { return 1; }

  Status Prepare(OpKernelContext*, int, Submission* s) override {
    s->request.dtype = 0;
    return Status();
  }

  Status Collect(OpKernelContext* ctx, int, int64_t handle) override {
    if (kOp != HVD_OP_JOIN) return Status();
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = static_cast<int32_t>(Api()->handle_value(handle));
    return Status();
  }
};

using BarrierKernel = ControlKernel<HVD_OP_BARRIER>;
using JoinKernel = ControlKernel<HVD_OP_JOIN>;

}  // namespace
}  // namespace hvdlite_tf

namespace tensorflow {  // the registration macros expect Name and DEVICE_CPU unqualified

#define HVDLITE_CPU_KERNEL(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(DEVICE_CPU), ::hvdlite_tf::kernel)

HVDLITE_CPU_KERNEL("HvdliteAllreduce", AllreduceKernel);
HVDLITE_CPU_KERNEL("HvdliteGroupedAllreduce", AllreduceKernel);
HVDLITE_CPU_KERNEL("HvdliteAllgather", AllgatherKernel);
HVDLITE_CPU_KERNEL("HvdliteGroupedAllgather", AllgatherKernel);
HVDLITE_CPU_KERNEL("HvdliteBroadcast", BroadcastKernel);
HVDLITE_CPU_KERNEL("HvdliteGroupedBroadcast", BroadcastKernel);
HVDLITE_CPU_KERNEL("HvdliteAlltoall", AlltoallKernel);
HVDLITE_CPU_KERNEL("HvdliteReducescatter", ReducescatterKernel);
HVDLITE_CPU_KERNEL("HvdliteGroupedReducescatter", ReducescatterKernel);
HVDLITE_CPU_KERNEL("HvdliteBarrier", BarrierKernel);
HVDLITE_CPU_KERNEL("HvdliteJoin", JoinKernel);

}  // namespace tensorflow

// TensorFlow op definitions of hvdlite's collectives: inputs, outputs,
// attributes and the static shapes TensorFlow can know before they run.
//
// Every op is stateful: TensorFlow must neither fold, deduplicate nor prune
// a collective, since the other ranks wait for it. Engine names come from
// `tensor_names` (one per tensor; empty: the engine names it, which is only
// safe when every rank submits in the same order, i.e. eagerly). Reducing ops
// carry the engine's ReduceOp code and compression spec; pre/postscale are
// float32 attributes (TensorFlow has no float64 attribute). `root_rank` is the
// root's position in the process set.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hvdlite_tf {
namespace {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

constexpr char kTypes[] =
    "{uint8, int8, uint16, int16, int32, int64, half, float, double, bfloat16, bool}";

// Output i has the shape of input i (allreduce, broadcast).
Status SameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return Status();
}

// Concatenated or scattered along the first dimension, whose length only
// the run knows (allgather, reducescatter, alltoall). A 0-d allgather input
// counts as one row; reducescatter and alltoall need a dimension to split.
Status RowsUnknown(InferenceContext* c, int input, int output, bool scalar_is_row) {
  ShapeHandle in = c->input(input);
  if (!c->RankKnown(in)) {
    c->set_output(output, c->UnknownShape());
    return Status();
  }
  if (c->Rank(in) == 0) {
    if (!scalar_is_row) {
      return ::tensorflow::errors::InvalidArgument(
          "hvdlite: this collective splits its input along the first dimension and needs a "
          "tensor with at least one dimension, not a scalar");
    }
    c->set_output(output, c->Vector(InferenceContext::kUnknownDim));
    return Status();
  }
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(output, out);
  return Status();
}

Status GatherShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) TF_RETURN_IF_ERROR(RowsUnknown(c, i, i, true));
  return Status();
}

Status ScatterShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) TF_RETURN_IF_ERROR(RowsUnknown(c, i, i, false));
  return Status();
}

Status AlltoallShapes(InferenceContext* c) {
  TF_RETURN_IF_ERROR(RowsUnknown(c, 0, 0, false));
  ShapeHandle splits;
  TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(1), 1, &splits));
  c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
  return Status();
}

#define HVDLITE_REDUCE_ATTRS                       \
  Attr("reduce_op: int")                           \
      .Attr("prescale_factor: float = 1.0")        \
      .Attr("postscale_factor: float = 1.0")       \
      .Attr("compression: int = 0")                \
      .Attr("topk_ratio: float = 0.0")             \
      .Attr("error_feedback: bool = false")        \
      .Attr("compression_config: int = 0")

#define HVDLITE_COMMON_ATTRS                       \
  Attr("tensor_names: list(string) = []")          \
      .Attr("process_set_id: int = 0")

}  // namespace

REGISTER_OP("HvdliteAllreduce")
    .Attr(std::string("T: ") + kTypes)
    .Input("tensor: T")
    .Output("output: T")
    .HVDLITE_REDUCE_ATTRS
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Reduces `tensor` over the ranks of the process set.");

REGISTER_OP("HvdliteGroupedAllreduce")
    .Attr(std::string("T: list(") + kTypes + ")")
    .Input("tensors: T")
    .Output("outputs: T")
    .HVDLITE_REDUCE_ATTRS
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Reduces each of `tensors`; submitted together so the engine can fuse them.");

REGISTER_OP("HvdliteAllgather")
    .Attr(std::string("T: ") + kTypes)
    .Input("tensor: T")
    .Output("output: T")
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(GatherShapes)
    .Doc("Concatenates every rank's `tensor` along the first dimension.");

REGISTER_OP("HvdliteGroupedAllgather")
    .Attr(std::string("T: list(") + kTypes + ")")
    .Input("tensors: T")
    .Output("outputs: T")
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(GatherShapes)
    .Doc("Allgather of each of `tensors`, submitted together.");

REGISTER_OP("HvdliteBroadcast")
    .Attr(std::string("T: ") + kTypes)
    .Input("tensor: T")
    .Output("output: T")
    .Attr("root_rank: int")
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("The root's `tensor` on every rank of the process set.");

REGISTER_OP("HvdliteGroupedBroadcast")
    .Attr(std::string("T: list(") + kTypes + ")")
    .Input("tensors: T")
    .Output("outputs: T")
    .Attr("root_rank: int")
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Broadcast of each of `tensors`, submitted together (broadcast_variables).");

REGISTER_OP("HvdliteAlltoall")
    .Attr(std::string("T: ") + kTypes)
    .Attr("Tsplits: {int32, int64} = DT_INT32")
    .Input("tensor: T")
    .Input("splits: Tsplits")
    .Output("output: T")
    .Output("received_splits: int32")
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(AlltoallShapes)
    .Doc("Sends splits[i] rows of `tensor` to rank i (empty `splits`: equal parts); "
         "returns the rows received and how many came from each rank.");

REGISTER_OP("HvdliteReducescatter")
    .Attr(std::string("T: ") + kTypes)
    .Input("tensor: T")
    .Output("output: T")
    .HVDLITE_REDUCE_ATTRS
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(ScatterShapes)
    .Doc("Reduces `tensor` and returns this rank's block of rows.");

REGISTER_OP("HvdliteGroupedReducescatter")
    .Attr(std::string("T: list(") + kTypes + ")")
    .Input("tensors: T")
    .Output("outputs: T")
    .HVDLITE_REDUCE_ATTRS
    .HVDLITE_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(ScatterShapes)
    .Doc("Reducescatter of each of `tensors`, submitted together.");

REGISTER_OP("HvdliteBarrier")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Completes once every rank of the process set has reached it.");

REGISTER_OP("HvdliteJoin")
    .Output("last_joined_rank: int32")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("This rank is out of data; completes when every rank has joined and "
         "returns the rank that joined last.");

}  // namespace hvdlite_tf

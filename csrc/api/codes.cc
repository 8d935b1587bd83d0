// The C API's codes (c_api.h) are the engine's own (common/common.h): front
// ends read them from c_api.h, the engine from common.h, and this file stops
// the build when the two disagree.
#include "api/c_api.h"
#include "common/common.h"

namespace hvdlite {
namespace {

template <typename E>
constexpr bool Same(E engine_code, int c_code) {
  return static_cast<int>(engine_code) == c_code;
}

static_assert(Same(OpType::kAllreduce, HVD_OP_ALLREDUCE) && Same(OpType::kAllgather, HVD_OP_ALLGATHER) &&
                  Same(OpType::kBroadcast, HVD_OP_BROADCAST) && Same(OpType::kAlltoall, HVD_OP_ALLTOALL) &&
                  Same(OpType::kReducescatter, HVD_OP_REDUCESCATTER) &&
                  Same(OpType::kBarrier, HVD_OP_BARRIER) &&
                  Same(OpType::kAddProcessSet, HVD_OP_ADD_PROCESS_SET) &&
                  Same(OpType::kRemoveProcessSet, HVD_OP_REMOVE_PROCESS_SET) &&
                  Same(OpType::kJoin, HVD_OP_JOIN) && kNumOpTypes == HVD_OP_JOIN + 1,
              "c_api.h hvd_op_type must match common.h OpType");

static_assert(Same(DataType::kUInt8, HVD_DTYPE_UINT8) && Same(DataType::kInt8, HVD_DTYPE_INT8) &&
                  Same(DataType::kInt32, HVD_DTYPE_INT32) && Same(DataType::kInt64, HVD_DTYPE_INT64) &&
                  Same(DataType::kFloat16, HVD_DTYPE_FLOAT16) &&
                  Same(DataType::kFloat32, HVD_DTYPE_FLOAT32) &&
                  Same(DataType::kFloat64, HVD_DTYPE_FLOAT64) &&
                  Same(DataType::kBFloat16, HVD_DTYPE_BFLOAT16) && Same(DataType::kBool, HVD_DTYPE_BOOL) &&
                  Same(DataType::kUInt16, HVD_DTYPE_UINT16) && Same(DataType::kInt16, HVD_DTYPE_INT16) &&
                  kNumDataTypes == HVD_DTYPE_INT16 + 1,
              "c_api.h hvd_data_type must match common.h DataType");

static_assert(Same(ReduceOp::kAverage, HVD_REDUCE_AVERAGE) && Same(ReduceOp::kSum, HVD_REDUCE_SUM) &&
                  Same(ReduceOp::kMin, HVD_REDUCE_MIN) && Same(ReduceOp::kMax, HVD_REDUCE_MAX) &&
                  Same(ReduceOp::kProduct, HVD_REDUCE_PRODUCT) && Same(ReduceOp::kAdasum, HVD_REDUCE_ADASUM),
              "c_api.h hvd_reduce_op must match common.h ReduceOp");

static_assert(Same(CompressionType::kNone, HVD_COMPRESSION_NONE) &&
                  Same(CompressionType::kFP16, HVD_COMPRESSION_FP16) &&
                  Same(CompressionType::kTopK, HVD_COMPRESSION_TOPK) &&
                  Same(CompressionType::kBF16, HVD_COMPRESSION_BF16) &&
                  Same(CompressionType::kPowerSGD, HVD_COMPRESSION_POWERSGD),
              "c_api.h hvd_compression_type must match common.h CompressionType");

static_assert(Same(ErrorKind::kNone, HVD_ERROR_NONE) &&
                  Same(ErrorKind::kInvalidArgument, HVD_ERROR_INVALID_ARGUMENT) &&
                  Same(ErrorKind::kMismatch, HVD_ERROR_MISMATCH) && Same(ErrorKind::kShutdown, HVD_ERROR_SHUTDOWN) &&
                  Same(ErrorKind::kMpi, HVD_ERROR_MPI) && Same(ErrorKind::kStall, HVD_ERROR_STALL) &&
                  Same(ErrorKind::kInternal, HVD_ERROR_INTERNAL) &&
                  Same(ErrorKind::kNotInitialized, HVD_ERROR_NOT_INITIALIZED) &&
                  Same(ErrorKind::kTimeout, HVD_ERROR_TIMEOUT),
              "c_api.h hvd_error_kind must match common.h ErrorKind");

}  // namespace
}  // namespace hvdlite

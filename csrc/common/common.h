// Shared vocabulary of the engine: data types, reduce ops, collective kinds.
// The integer values are part of the C API (c_api.h) and of the Python binding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdlite {

enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kFloat32 = 5,
  kFloat64 = 6,
  kBFloat16 = 7,
  kBool = 8,
  kUInt16 = 9,
  kInt16 = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Horovod's adaptive summation (adasum/adasum_reducer.h); floating-point
  // allreduce only, on a power-of-2 number of ranks.
  kAdasum = 5,
};

enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kAddProcessSet = 6,
  kRemoveProcessSet = 7,
  kJoin = 8,  // this rank is out of data; it contributes zeros until all join
};
constexpr int kNumOpTypes = 9;

// Codes of the compressors (compressors/registry.h): each compressor's file
// registers its own; the names here are for C++ code that refers to one.
enum class CompressionType : int32_t {
  kNone = 0,
  kFP16 = 1,
  kTopK = 2,
  kBF16 = 3,
  kPowerSGD = 4,
  kQuantize = 5,
};
constexpr int kMaxCompressionKinds = 16;

// Why a handle failed; the Python binding maps each kind to an exception class.
enum class ErrorKind : int32_t {
  kNone = 0,
  kInvalidArgument = 1,  // bad input detected on this rank
  kMismatch = 2,         // ranks disagree on a tensor's metadata
  kShutdown = 3,         // the engine stopped (shutdown or a rank left)
  kMpi = 4,              // an MPI call failed
  kStall = 5,            // the stall inspector gave up waiting
  kInternal = 6,
  kNotInitialized = 7,   // no engine: init() not called, or shutdown() was
  kTimeout = 8,          // a peer did not answer in time (dead or hung rank)
};

bool IsValidDataType(int32_t value);
size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
bool IsFloatingPoint(DataType dtype);
bool IsValidReduceOp(int32_t value);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);
const char* CompressionName(CompressionType type);  // compressors/registry.cc

std::string ShapeString(const std::vector<int64_t>& shape);
int64_t NumElements(const std::vector<int64_t>& shape);

}  // namespace hvdlite

// Compressors with options (hvd_compression_config), named by id in a
// request's compression_config field.
#pragma once

#include <cstdint>

#include "compressors/compressor.h"

namespace hvdlite {
namespace api {

// The spec a request's compression fields name: the registered config when
// `config` is not 0, else `code` with its ratio and error feedback. False
// for an unknown code or id.
bool ResolveCompression(int32_t code, double topk_ratio, int32_t error_feedback, int32_t config,
                        CompressionSpec* out);

}  // namespace api
}  // namespace hvdlite

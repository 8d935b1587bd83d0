// The compressed-collective recipe, in one place: each rank compresses its
// float32 values into the compressor's wire form; the forms cross the wire
// summed as the compressor's element type (fp16, bf16: Wire::kAllreduce), or
// gathered, every rank's form added up here (top-k: Wire::kAllgather); the
// sum is decompressed. The allreduce pipeline's compressed buckets, the
// compressed allreduce between hosts and the compressed reducescatter all
// run it; a compressor with an exchange of its own (PowerSGD) does not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "compressors/compressor.h"
#include "transport/transport.h"

namespace hvdlite {

// One rank's wire form and, for a gathering compressor, every rank's.
struct CompressedForms {
  uint8_t* mine = nullptr;      // this rank's form; after a summed exchange, the sum's
  uint8_t* gathered = nullptr;  // kAllgather: every rank's form, `bytes` apart, in rank order
  size_t bytes = 0;             // one rank's form
  int ranks = 0;                // how many forms `gathered` holds
};

// Whether the compressor's forms are gathered (and added here) rather than summed.
inline bool GathersForms(const Compressor& c) { return c.wire() == Compressor::Wire::kAllgather; }

// Compresses `count` float32 values of `input` as `segs` into `out`, scaled
// by `prescale` first (through `scratch`); returns the bytes written.
size_t CompressScaled(Compressor& c, const float* input, int64_t count, double prescale,
                      const std::vector<Segment>& segs, uint8_t* out, std::vector<float>* scratch);

// The timeline's name for the exchange of the forms on `wire`.
const char* CompressedActivity(const Transport& wire, const Compressor& c);

// Starts the exchange of the forms: summed in place in `forms.mine` as the
// wire type, or gathered into `forms.gathered`.
Status StartCompressedExchange(Transport& wire, const Compressor& c, const CompressedForms& forms,
                               std::unique_ptr<TransportWork>* work);

// After the exchange: `out` (the segments' `count` float32 values) = the sum
// of every rank's values, from the forms at `offset` bytes into each form.
void DecodeCompressedSum(Compressor& c, const CompressedForms& forms, size_t offset,
                         const std::vector<Segment>& segs, int64_t count, float* out);

}  // namespace hvdlite

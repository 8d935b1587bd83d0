// A bucket whose tensors cross the wire in the compressor's form, each
// tensor one segment (residuals follow tensor names): compressed into a
// send buffer, exchanged and decompressed by the compressed-collective
// recipe (compressed_wire.h: summed as the wire type, or gathered and added).
// 16-bit floats (for a compressor that takes them) are widened on the way in
// and narrowed once on the way out.
#pragma once

#include "allreduce/bucket_strategy.h"
#include "ops/operation_context.h"

namespace hvdlite {

class CompressedBucket : public BucketStrategy {
 public:
  explicit CompressedBucket(OperationContext* ctx) : ctx_(ctx) {}
  Status Prepare(Bucket& b, TransportWork* in_flight) override;
  const char* Activity(const Bucket& b) const override;
  Status Start(Bucket& b) override;
  void Finish(Bucket& b, TransportWork* in_flight) override;

 private:
  OperationContext* ctx_;
};

}  // namespace hvdlite

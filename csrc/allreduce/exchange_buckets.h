// Buckets staged dense (dense_buckets.h) and compressed by a collective of
// their own, synchronously (its steps depend on each other): the
// compressor's own exchange (PowerSGD's factors describe whole matrices, so
// it runs over the whole set), or the compressed allreduce between hosts
// (host_compressed_allreduce.h: exact inside each host, compressed between).
#pragma once

#include "allreduce/dense_buckets.h"
#include "allreduce/host_compressed_allreduce.h"

namespace hvdlite {

class ExchangeBucket : public StagedBucket {
 public:
  using StagedBucket::StagedBucket;
  const char* Activity(const Bucket& b) const override;
  Status Start(Bucket& b) override;
};

class AcrossHostsBucket : public StagedBucket {
 public:
  using StagedBucket::StagedBucket;
  const char* Activity(const Bucket& b) const override;
  Status Start(Bucket& b) override;

 private:
  HostCompressedAllreduce across_hosts_;
};

}  // namespace hvdlite

#include "allreduce/host_compressed_allreduce.h"

#include <algorithm>
#include <string>

#include "allreduce/compressed_wire.h"

namespace hvdlite {

void HostCompressedAllreduce::BlockSegments(const std::vector<Segment>& segs, int64_t lo, int64_t hi) {
  block_segs_.clear();
  for (const Segment& s : segs) {
    const int64_t begin = std::max(lo, s.offset), end = std::min(hi, s.offset + s.count);
    if (begin >= end) continue;
    Segment part;
    part.name = (begin == s.offset && end == s.offset + s.count)
                    ? s.name
                    : s.name + "@" + std::to_string(begin - s.offset);
    part.offset = begin - lo;
    part.count = end - begin;
    block_segs_.push_back(std::move(part));
  }
}

Status HostCompressedAllreduce::Run(const HostLevels& levels, Compressor* compressor, float* data,
                                    int64_t count, const std::vector<Segment>& segs, int64_t* wire_bytes) {
  Transport& host = *levels.host;
  Transport& across = *levels.across;
  // Blocks as even as can be; the first count % size ranks take one more.
  const int local_size = host.size(), local_rank = host.rank();
  std::vector<int64_t> counts(static_cast<size_t>(local_size), count / local_size);
  for (int64_t r = 0; r < count % local_size; ++r) ++counts[static_cast<size_t>(r)];
  int64_t lo = 0;
  for (int r = 0; r < local_rank; ++r) lo += counts[static_cast<size_t>(r)];
  const int64_t mine = counts[static_cast<size_t>(local_rank)];

  block_.resize(static_cast<size_t>(std::max<int64_t>(mine, 1)));
  Status s = host.ReduceScatter(data, block_.data(), counts, DataType::kFloat32, ReduceOp::kSum);
  if (!s.ok()) return s;

  BlockSegments(segs, lo, lo + mine);
  compressor->BeginRound(block_segs_);  // a block's part is its own tensor here
  wire_.resize(std::max<size_t>(compressor->CompressedBytes(block_segs_), 1));
  CompressedForms forms;
  forms.mine = wire_.data();
  forms.bytes = compressor->Compress(block_.data(), block_segs_, wire_.data());
  forms.ranks = across.size();
  *wire_bytes += static_cast<int64_t>(forms.bytes);
  if (GathersForms(*compressor)) {
    // Every host's block has the same segments, so the same wire size.
    gathered_.resize(std::max<size_t>(forms.bytes * static_cast<size_t>(forms.ranks), 1));
    forms.gathered = gathered_.data();
  }
  std::unique_ptr<TransportWork> work;
  s = StartCompressedExchange(across, *compressor, forms, &work);
  if (s.ok()) s = work->Wait();
  if (s.ok()) DecodeCompressedSum(*compressor, forms, 0, block_segs_, mine, block_.data());
  if (!s.ok()) return s;

  std::vector<int64_t> block_bytes(counts);
  for (int64_t& b : block_bytes) b *= static_cast<int64_t>(sizeof(float));
  return host.Allgatherv(block_.data(), mine * static_cast<int64_t>(sizeof(float)), data, block_bytes);
}

}  // namespace hvdlite

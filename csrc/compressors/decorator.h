// The base of compressors that wrap another one (error feedback, Deep Gradient
// Compression's momentum correction and clipping): every call goes to the
// inner compressor unless the decorator overrides it, so a decorator states
// only what it changes (usually Compress, Describe and Reset), as
// transport/forwarding_transport.h does for wires.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compressors/compressor.h"

namespace hvdlite {

class CompressorDecorator : public Compressor {
 public:
  explicit CompressorDecorator(std::unique_ptr<Compressor> inner) : inner_(std::move(inner)) {}

  std::string Describe() const override { return inner_->Describe(); }
  Wire wire() const override { return inner_->wire(); }
  size_t CompressedBytes(const std::vector<Segment>& segs) const override {
    return inner_->CompressedBytes(segs);
  }
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override {
    return inner_->Compress(input, segs, out);
  }
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override {
    inner_->Decompress(in, segs, out);
  }
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override {
    inner_->DecompressAdd(in, segs, out);
  }
  DataType wire_dtype() const override { return inner_->wire_dtype(); }
  void Reset() override { inner_->Reset(); }
  bool Sparsifies(const Segment& s) const override { return inner_->Sparsifies(s); }
  void BeginRound(const std::vector<Segment>& segs) override { inner_->BeginRound(segs); }
  Status Exchange(Transport& wire, float* data, const std::vector<Segment>& segs,
                  int64_t* wire_bytes) override {
    return inner_->Exchange(wire, data, segs, wire_bytes);
  }

  Compressor* inner() const { return inner_.get(); }

 protected:
  std::unique_ptr<Compressor> inner_;
};

}  // namespace hvdlite

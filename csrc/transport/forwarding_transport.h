// A transport that hands every call to an inner one: the base of wires that
// change a few collectives and keep the rest (shared memory on one host, the
// ring between hosts), so each states only what it does differently.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace hvdlite {

class ForwardingTransport : public Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool Supports(DataType dtype, ReduceOp op) const override { return inner_->Supports(dtype, op); }
  const char* Activity(OpType op, DataType dtype, ReduceOp reduce) const override {
    return inner_->Activity(op, dtype, reduce);
  }
  Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                        double scale, std::unique_ptr<TransportWork>* work) override {
    return inner_->StartAllreduce(send, recv, count, dtype, op, scale, work);
  }
  Status StartAllgather(const void* send, int64_t bytes, void* recv,
                        std::unique_ptr<TransportWork>* work) override {
    return inner_->StartAllgather(send, bytes, recv, work);
  }
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override {
    return inner_->Allreduce(data, count, dtype, op);
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override {
    return inner_->Allgatherv(input, input_bytes, output, bytes_per_rank);
  }
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override {
    return inner_->Alltoallv(input, send_bytes, output, recv_bytes);
  }
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override {
    return inner_->ReduceScatter(input, output, counts, dtype, op);
  }
  Status Barrier() override { return inner_->Barrier(); }
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int peer,
                  int tag) override {
    return inner_->SendRecv(send, send_bytes, recv, recv_bytes, peer, tag);
  }
  Status BitwiseAnd(uint64_t* words, int count) override { return inner_->BitwiseAnd(words, count); }
  Status GatherBytes(const std::vector<uint8_t>& mine, int root,
                     std::vector<std::vector<uint8_t>>* all) override {
    return inner_->GatherBytes(mine, root, all);
  }
  void WatchDuringNegotiation(std::function<Status()> peer_lost) override {
    inner_->WatchDuringNegotiation(std::move(peer_lost));
  }
  bool GetWireSettings(WireSettings* out) const override { return inner_->GetWireSettings(out); }
  void Tune(const WireSettings& settings) override { inner_->Tune(settings); }
  bool GetHostLevels(HostLevels* out) override { return inner_->GetHostLevels(out); }
  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    return inner_->BroadcastBytes(bytes, root);
  }
  void Abandon() override { inner_->Abandon(); }

 protected:
  Transport& inner() { return *inner_; }
  const Transport& inner() const { return *inner_; }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace hvdlite

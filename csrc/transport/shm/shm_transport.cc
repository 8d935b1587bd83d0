#include "transport/shm/shm_transport.h"

#include <climits>

#include "timeline/timeline_names.h"

namespace hvdlite {

std::unique_ptr<Transport> ShmTransport::Create(std::unique_ptr<MpiTransport> mpi, bool want,
                                                const ShmSetup& setup) {
  auto shm = ShmCollectives::Create(mpi->comm(), want, setup);
  if (!shm) return mpi;
  return std::unique_ptr<Transport>(new ShmTransport(std::move(mpi), std::move(shm), setup.stats));
}

const char* ShmTransport::Activity(OpType op, DataType dtype, ReduceOp reduce) const {
  if (op == OpType::kAllreduce && ShmCollectives::Supports(dtype, reduce)) return activity::kShmAllreduce;
  return inner().Activity(op, dtype, reduce);
}

Status ShmTransport::StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                    ReduceOp op, double scale, std::unique_ptr<TransportWork>* work) {
  if (!ShmCollectives::Supports(dtype, op)) {
    return inner().StartAllreduce(send, recv, count, dtype, op, scale, work);
  }
  stats_->Add(stats_->shm_collectives, 1);
  *work = std::make_unique<DoneWork>(shm_->Allreduce(send, recv, count, dtype, op, scale));
  return Status::OK();
}

Status ShmTransport::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  if (!ShmCollectives::Supports(dtype, op)) return inner().Allreduce(data, count, dtype, op);
  stats_->Add(stats_->shm_collectives, 1);
  return shm_->Allreduce(Transport::kInPlace, data, count, dtype, op, 1.0);
}

Status ShmTransport::BitwiseAnd(uint64_t* words, int count) {
  return shm_->FitsBoard(count) ? shm_->BitwiseAnd(words, count) : inner().BitwiseAnd(words, count);
}

void ShmTransport::Abandon() {
  shm_->Unmap();
  ForwardingTransport::Abandon();
}

}  // namespace hvdlite

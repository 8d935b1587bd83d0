#include "transport/socket/socket_ring_allreduce.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "kernels/reduce_kernels.h"
#include "transport/waiter.h"

namespace hvdlite {

namespace {

// The longest one poll(2) sleeps before the wait checks for an abort and
// its timeout again.
constexpr int kPollMs = 50;

}  // namespace

SocketRingAllreduceWork::SocketRingAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype,
                                                 ReduceOp op, double scale)
    : setup_(setup), buffer_(data, count, dtype, op, scale),
      schedule_(setup.link->rank(), setup.link->size(), count, setup.chunk_elems),
      transfers_(schedule_.transfers()), slot_bytes_(schedule_.longest_chunk() * buffer_.elem) {}

SocketRingAllreduceWork::~SocketRingAllreduceWork() {
  if (in_line_) setup_.link->Leave(this, status_);
}

Status SocketRingAllreduceWork::Start() {
  setup_.link->Join(this);
  in_line_ = true;
  setup_.link->Advance();
  return status_;
}

void SocketRingAllreduceWork::Progress() { setup_.link->Advance(); }

Status SocketRingAllreduceWork::Wait() {
  Status s = WaitUntilIdle(
      *setup_.wait, setup_.abort, "socket ring allreduce",
      [this](Status* error) {
        setup_.link->Advance();
        *error = status_;
        return !in_line_;
      },
      [this](std::chrono::steady_clock::duration) { setup_.link->Poll(kPollMs); });
  if (!s.ok() && status_.ok()) {
    status_ = s;  // an abort or the timeout: the streams are left mid-transfer
    setup_.link->Leave(this, s);
    in_line_ = false;
  }
  if (s.ok()) buffer_.ApplyScale();
  return s;
}

bool SocketRingAllreduceWork::Fail(const Status& why) {
  status_ = why;
  in_line_ = false;  // the link drops it from its line
  setup_.link->Break(why);
  return true;
}

bool SocketRingAllreduceWork::Step() {
  if (!setup_.link->broken().ok()) {
    status_ = setup_.link->broken();
    in_line_ = false;
    return true;
  }
  // First in line: the link's read-ahead slots are this work's now.
  slots_ = setup_.link->ReadAhead(static_cast<size_t>(setup_.window * slot_bytes_));
  for (bool moved = true; moved && !finished();) {
    moved = false;
    Status s = Receive(&moved);
    if (s.ok()) Process(&moved);
    if (s.ok()) s = Send(&moved);
    if (!s.ok()) return Fail(s);
  }
  if (finished()) in_line_ = false;
  return finished();
}

int64_t SocketRingAllreduceWork::Bytes(int64_t t, bool sending, int64_t* lo) const {
  int64_t n;
  schedule_.Range(t, sending, lo, &n);
  return n * buffer_.elem;
}

bool SocketRingAllreduceWork::WantsReceive() const {
  return received_ < transfers_ && received_ - processed_ < setup_.window;
}

bool SocketRingAllreduceWork::WantsSend() const {
  return sent_ < transfers_ && schedule_.CanSend(sent_, processed_);
}

// Reads ahead of the sums, in transfer order, into the slots.
Status SocketRingAllreduceWork::Receive(bool* moved) {
  const int fd = setup_.link->from_left();
  while (WantsReceive()) {
    int64_t lo;
    const int64_t bytes = Bytes(received_, false, &lo);
    if (received_bytes_ < bytes) {
      uint8_t* slot = slots_ + (received_ % setup_.window) * slot_bytes_;
      const ssize_t r = recv(fd, slot + received_bytes_, static_cast<size_t>(bytes - received_bytes_), 0);
      if (r == 0) return NeighbourLost("left", schedule_.left(), "closed its connection");
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
        return NeighbourLost("left", schedule_.left(),
                             std::string("could not be read from: ") + std::strerror(errno));
      }
      received_bytes_ += r;
      *moved = true;
      if (received_bytes_ < bytes) continue;
    }
    ++received_;
    received_bytes_ = 0;
    *moved = true;
  }
  return Status::OK();
}

// Sums (reduce-scatter) or copies (allgather) the chunks read, in order.
void SocketRingAllreduceWork::Process(bool* moved) {
  while (processed_ < received_) {
    // A gathered chunk overwrites what an earlier send read: only once the
    // kernel has taken all of it.
    if (schedule_.Gathering(processed_) && sent_ <= schedule_.EarlierSend(processed_)) return;
    int64_t lo;
    const int64_t bytes = Bytes(processed_, false, &lo);
    const uint8_t* slot = slots_ + (processed_ % setup_.window) * slot_bytes_;
    if (schedule_.Gathering(processed_)) {
      std::memcpy(buffer_.data + lo * buffer_.elem, slot, static_cast<size_t>(bytes));
    } else {
      ReduceInto(slot, buffer_.data + lo * buffer_.elem, bytes / buffer_.elem, buffer_.dtype, buffer_.op);
    }
    ++processed_;
    *moved = true;
  }
}

// Writes the chunks whose data is in place, in transfer order.
Status SocketRingAllreduceWork::Send(bool* moved) {
  const int fd = setup_.link->to_right();
  while (WantsSend()) {
    int64_t lo;
    const int64_t bytes = Bytes(sent_, true, &lo);
    if (sent_bytes_ < bytes) {
      const ssize_t w = send(fd, buffer_.data + lo * buffer_.elem + sent_bytes_,
                             static_cast<size_t>(bytes - sent_bytes_), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
        return NeighbourLost("right", schedule_.right(),
                             std::string("could not be written to: ") + std::strerror(errno));
      }
      sent_bytes_ += w;
      *moved = true;
      if (sent_bytes_ < bytes) continue;
    }
    ++sent_;
    sent_bytes_ = 0;
    *moved = true;
  }
  return Status::OK();
}

}  // namespace hvdlite

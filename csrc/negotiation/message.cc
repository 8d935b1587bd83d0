#include "negotiation/message.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "compressors/compressor.h"  // CompressionArguments

namespace hvdlite {

std::string CompressionSpec::ToString() const { return CompressionName(type) + CompressionArguments(*this); }

namespace {

// Little-endian fixed-width encoding; all ranks run the same build.
class Writer {
 public:
  template <typename T>
  void Put(const T& value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  template <typename T>
  void PutInts(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    for (T x : v) Put(x);
  }
  std::vector<uint8_t> Take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Get() {
    Need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string GetString() {
    auto n = Get<uint64_t>();
    Need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T = int64_t>
  std::vector<T> GetInts() {
    auto n = Get<uint64_t>();
    Need(n * sizeof(T));
    std::vector<T> v(n);
    for (auto& x : v) x = Get<T>();
    return v;
  }

 private:
  void Need(size_t n) {
    if (pos_ + n > size_) throw std::runtime_error("hvdlite: truncated negotiation message");
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void PutCompression(Writer& w, const CompressionSpec& c) {
  w.Put<int32_t>(static_cast<int32_t>(c.type));
  w.Put<double>(c.topk_ratio);
  w.Put<uint8_t>(c.error_feedback ? 1 : 0);
  w.Put<double>(c.momentum);
  w.Put<int64_t>(c.warmup_steps);
  w.Put<double>(c.clip_norm);
  w.Put<int32_t>(c.rank);
  w.Put<int64_t>(c.start_iter);
  w.Put<int32_t>(c.bits);
  w.Put<int64_t>(c.block_size);
  w.Put<uint8_t>(c.stochastic ? 1 : 0);
  w.Put<int64_t>(c.seed);
}

CompressionSpec GetCompression(Reader& r) {
  CompressionSpec c;
  c.type = static_cast<CompressionType>(r.Get<int32_t>());
  c.topk_ratio = r.Get<double>();
  c.error_feedback = r.Get<uint8_t>() != 0;
  c.momentum = r.Get<double>();
  c.warmup_steps = r.Get<int64_t>();
  c.clip_norm = r.Get<double>();
  c.rank = r.Get<int32_t>();
  c.start_iter = r.Get<int64_t>();
  c.bits = r.Get<int32_t>();
  c.block_size = r.Get<int64_t>();
  c.stochastic = r.Get<uint8_t>() != 0;
  c.seed = r.Get<int64_t>();
  return c;
}

void PutRequest(Writer& w, const Request& q) {
  w.Put<int32_t>(q.rank);
  w.Put<int32_t>(static_cast<int32_t>(q.op));
  w.PutString(q.name);
  w.Put<uint8_t>(q.auto_named ? 1 : 0);
  w.Put<int32_t>(static_cast<int32_t>(q.dtype));
  w.PutInts(q.shape);
  w.Put<int32_t>(static_cast<int32_t>(q.reduce_op));
  w.Put<double>(q.prescale);
  w.Put<double>(q.postscale);
  w.Put<int32_t>(q.root_rank);
  PutCompression(w, q.compression);
  w.PutInts(q.splits);
  w.PutInts(q.set_ranks);
  w.Put<uint8_t>(q.members_only ? 1 : 0);
  w.Put<int32_t>(q.target_set);
  w.Put<uint8_t>(q.device ? 1 : 0);
}

Request GetRequest(Reader& r) {
  Request q;
  q.rank = r.Get<int32_t>();
  q.op = static_cast<OpType>(r.Get<int32_t>());
  q.name = r.GetString();
  q.auto_named = r.Get<uint8_t>() != 0;
  q.dtype = static_cast<DataType>(r.Get<int32_t>());
  q.shape = r.GetInts();
  q.reduce_op = static_cast<ReduceOp>(r.Get<int32_t>());
  q.prescale = r.Get<double>();
  q.postscale = r.Get<double>();
  q.root_rank = r.Get<int32_t>();
  q.compression = GetCompression(r);
  q.splits = r.GetInts();
  q.set_ranks = r.GetInts<int32_t>();
  q.members_only = r.Get<uint8_t>() != 0;
  q.target_set = r.Get<int32_t>();
  q.device = r.Get<uint8_t>() != 0;
  return q;
}

}  // namespace

std::vector<uint8_t> Serialize(const RequestList& list) {
  Writer w;
  w.Put<uint8_t>(list.shutdown ? 1 : 0);
  w.PutString(list.shutdown_reason);
  w.Put<uint64_t>(list.requests.size());
  for (const auto& q : list.requests) PutRequest(w, q);
  return w.Take();
}

RequestList DeserializeRequestList(const uint8_t* data, size_t size) {
  Reader r(data, size);
  RequestList list;
  list.shutdown = r.Get<uint8_t>() != 0;
  list.shutdown_reason = r.GetString();
  auto n = r.Get<uint64_t>();
  list.requests.reserve(n);
  for (uint64_t i = 0; i < n; ++i) list.requests.push_back(GetRequest(r));
  return list;
}

std::vector<uint8_t> Serialize(const ResponseList& list) {
  Writer w;
  w.Put<uint8_t>(list.shutdown ? 1 : 0);
  w.Put<uint64_t>(list.shutdown_ranks.size());
  for (size_t i = 0; i < list.shutdown_ranks.size(); ++i) {
    w.Put<int32_t>(list.shutdown_ranks[i]);
    w.PutString(list.shutdown_reasons[i]);
  }
  w.PutString(list.stall_error);
  w.Put<uint64_t>(list.invalidated.size());
  for (const auto& n : list.invalidated) w.PutString(n);
  w.Put<uint64_t>(list.responses.size());
  for (const auto& p : list.responses) {
    w.Put<int32_t>(static_cast<int32_t>(p.kind));
    PutRequest(w, p.request);
    w.PutString(p.error);
    w.PutInts(p.rows_per_rank);
    w.PutInts(p.splits_matrix);
    w.Put<int32_t>(p.last_joined_rank);
    w.Put<uint8_t>(p.cacheable ? 1 : 0);
  }
  return w.Take();
}

ResponseList DeserializeResponseList(const uint8_t* data, size_t size) {
  Reader r(data, size);
  ResponseList list;
  list.shutdown = r.Get<uint8_t>() != 0;
  auto ns = r.Get<uint64_t>();
  for (uint64_t i = 0; i < ns; ++i) {
    list.shutdown_ranks.push_back(r.Get<int32_t>());
    list.shutdown_reasons.push_back(r.GetString());
  }
  list.stall_error = r.GetString();
  auto ni = r.Get<uint64_t>();
  for (uint64_t i = 0; i < ni; ++i) list.invalidated.push_back(r.GetString());
  auto n = r.Get<uint64_t>();
  list.responses.resize(n);
  for (auto& p : list.responses) {
    p.kind = static_cast<Response::Kind>(r.Get<int32_t>());
    p.request = GetRequest(r);
    p.error = r.GetString();
    p.rows_per_rank = r.GetInts();
    p.splits_matrix = r.GetInts();
    p.last_joined_rank = r.Get<int32_t>();
    p.cacheable = r.Get<uint8_t>() != 0;
  }
  return list;
}

}  // namespace hvdlite

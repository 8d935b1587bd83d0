#include "ops/device_jobs.h"

#include <cctype>
#include <chrono>
#include <sstream>

#include "common/json_text.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

void AppendInts(std::string* out, const std::vector<int64_t>& v) {
  out->push_back('[');
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out->push_back(',');
    AppendInt(out, v[i]);
  }
  out->push_back(']');
}

std::string Number(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

}  // namespace

void DeviceJobQueue::Enable(const std::string& backend) {
  std::lock_guard<std::mutex> lock(mutex_);
  backend_ = backend;
}

bool DeviceJobQueue::enabled() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !backend_.empty() && !closed_;
}

void DeviceJobQueue::Push(DeviceJob job) {
  std::string backend;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    backend = backend_;
  }
  for (char& c : backend) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::string op = OpTypeName(job.response.op());
  for (char& c : op) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  job.activity = backend + "_" + op;
  if (timeline_ && timeline_->active()) {
    for (auto& e : job.entries) timeline_->Begin(TimelineRow(e.request), job.activity.c_str());
  }
  Status closed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      job.id = next_id_++;
      waiting_.push_back(std::move(job));
      cv_.notify_all();
      return;
    }
    closed = closed_reason_;
  }
  Complete(job, closed);
}

int DeviceJobQueue::Next(double timeout_seconds, std::string* text) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(timeout_seconds));
  if (!cv_.wait_until(lock, until, [this] { return closed_ || !waiting_.empty(); })) return 0;
  if (closed_) return -1;
  DeviceJob job = std::move(waiting_.front());
  waiting_.pop_front();
  *text = Describe(job);
  running_.emplace(job.id, std::move(job));
  return 1;
}

bool DeviceJobQueue::Finish(int64_t id, const Status& status) {
  DeviceJob job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = running_.find(id);
    if (it == running_.end()) return false;
    job = std::move(it->second);
    running_.erase(it);
  }
  Complete(job, status);
  return true;
}

void DeviceJobQueue::Close(const Status& reason) {
  std::deque<DeviceJob> waiting;
  std::map<int64_t, DeviceJob> running;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    closed_reason_ = reason;
    waiting.swap(waiting_);
    running.swap(running_);
    cv_.notify_all();
  }
  for (auto& job : waiting) Complete(job, reason);
  for (auto& kv : running) Complete(kv.second, reason);
}

void DeviceJobQueue::Complete(DeviceJob& job, const Status& status) {
  const bool timeline = timeline_ && timeline_->active();
  for (auto& e : job.entries) {
    if (timeline) {
      const std::string row = TimelineRow(e.request);
      timeline_->End(row, job.activity.c_str());
      timeline_->End(row, OperationPhase(e.request));
    }
    if (status.ok()) {
      e.work->Finish();
    } else {
      e.work->Fail(status);
    }
  }
}

std::string DeviceJobQueue::Describe(const DeviceJob& job) {
  const Request& q = job.response.request;
  std::string out = "{\"id\":";
  AppendInt(&out, job.id);
  out += ",\"op\":" + JsonQuote(OpTypeName(q.op));
  out += ",\"process_set\":";
  AppendInt(&out, job.process_set);
  out += ",\"set_rank\":";
  AppendInt(&out, job.set_rank);
  out += ",\"set_size\":";
  AppendInt(&out, job.set_size);
  out += ",\"reduce_op\":";
  AppendInt(&out, static_cast<int64_t>(q.reduce_op));
  out += ",\"root\":";
  AppendInt(&out, q.root_rank);
  out += ",\"compression\":";
  AppendInt(&out, static_cast<int64_t>(q.compression.type));
  out += ",\"topk_ratio\":" + Number(q.compression.topk_ratio);
  out += std::string(",\"error_feedback\":") + (q.compression.error_feedback ? "true" : "false");
  out += ",\"rows\":";
  AppendInts(&out, job.response.rows_per_rank);
  out += ",\"splits\":";
  AppendInts(&out, job.response.splits_matrix);
  out += ",\"entries\":[";
  for (size_t i = 0; i < job.entries.size(); ++i) {
    const TensorEntry& e = job.entries[i];
    if (i) out.push_back(',');
    out += "{\"token\":";
    AppendInt(&out, static_cast<int64_t>(reinterpret_cast<uintptr_t>(e.input)));
    out += ",\"name\":" + JsonQuote(e.request.name) + ",\"dtype\":";
    AppendInt(&out, static_cast<int64_t>(e.request.dtype));
    out += ",\"shape\":";
    AppendInts(&out, e.request.shape);
    out += ",\"prescale\":" + Number(e.request.prescale) + ",\"postscale\":" + Number(e.request.postscale);
    out.push_back('}');
  }
  out += "]}";
  return out;
}

}  // namespace hvdlite

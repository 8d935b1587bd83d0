#include "timeline/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "common/json_text.h"

namespace hvdlite {

namespace {

// Fixed rows ahead of the tensor rows (tid 0 carries the process metadata).
constexpr int64_t kCycleTid = 1;
constexpr int64_t kNoticeTid = 2;
constexpr int64_t kFirstTensorTid = 3;
const char kCycleRowName[] = "cycle markers";
const char kNoticeRowName[] = "timeline notices";

// The writer is woken early past this, so heavy bursts go out in ~1 MB
// writes instead of piling up until the next interval.
constexpr size_t kWakeBytes = size_t{1} << 20;


std::string ExpandRank(const std::string& pattern, int rank) {
  std::string out;
  const std::string r = std::to_string(rank);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'r') {
      out += r;
      ++i;
    } else {
      out.push_back(pattern[i]);
    }
  }
  return out;
}

// 0 or the errno of the failed write.
int WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

std::string OsError(int err) { return std::error_code(err, std::generic_category()).message(); }

// `args_json`: the body of the args object, as for Timeline::Begin.
void AppendMetadata(std::string* out, const char* what, int64_t pid, int64_t tid,
                    const std::string& args_json) {
  out->append("{\"name\":\"");
  out->append(what);
  out->append("\",\"ph\":\"M\",\"pid\":");
  AppendInt(out, pid);
  out->append(",\"tid\":");
  AppendInt(out, tid);
  out->append(",\"args\":{");
  out->append(args_json);
  out->append("}}");
}

// The array's opening and the process's metadata rows.
std::string FileHeader(int rank, int64_t start_us) {
  std::string header = "[\n";
  AppendMetadata(&header, "process_name", rank, 0,
                 "\"name\":" + JsonQuote("rank " + std::to_string(rank)) +
                     ",\"start_time_since_epoch_in_micros\":" + std::to_string(start_us));
  header.append(",\n");
  AppendMetadata(&header, "process_sort_index", rank, 0, "\"sort_index\":" + std::to_string(rank));
  return header;
}

}  // namespace

Timeline::Timeline(TimelineOptions options) : options_(options) {}

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& pattern, int rank) {
  std::lock_guard<std::mutex> life(lifecycle_mu_);
  const std::string path = ExpandRank(pattern, rank);

  // Opening with O_TRUNC the very file being written would corrupt it: stop
  // that recording first. Any other file is opened before stopping, so a bad
  // new path leaves the running recording alone.
  if (writer_.joinable()) {
    struct stat want, have;
    if (::stat(path.c_str(), &want) == 0 && ::fstat(fd_, &have) == 0 &&
        want.st_dev == have.st_dev && want.st_ino == have.st_ino) {
      StopLocked();
    }
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::InvalidArgument("timeline: cannot create '" + path + "': " + OsError(errno));
  }

  // Event times are microseconds since this moment, which the process
  // metadata records as wall-clock time (the key Horovod's timeline uses), so
  // readers can place the file in time and line up the ranks' files.
  const auto mono0 = std::chrono::steady_clock::now();
  const int64_t start_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();

  // Written synchronously so the file is a valid trace from the first moment.
  const std::string header = FileHeader(rank, start_us);
  if (int err = WriteAll(fd, header.data(), header.size())) {
    ::close(fd);
    return Status::InvalidArgument("timeline: cannot write '" + path + "': " + OsError(err));
  }

  StopLocked();
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd_ = fd;
    path_ = path;
    rank_ = rank;
    open_ = true;
    stopping_ = false;
    failed_ = false;
    pending_.clear();
    in_flight_ = 0;
    rows_.clear();
    cycle_row_ = Row();
    cycle_row_.tid = kCycleTid;
    notice_row_ = Row();
    notice_row_.tid = kNoticeTid;
    next_tid_ = kFirstTensorTid;
    mono0_ = mono0;
    dropped_reported_ = 0;
    file_limit_noticed_ = false;
    stats_ = TimelineStats();
    stats_.bytes_written = header.size();
  }
  try {
    writer_ = std::thread(&Timeline::WriterMain, this);
  } catch (const std::system_error& e) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    ::close(fd_);
    fd_ = -1;
    return Status::Error(ErrorKind::kInternal,
                         std::string("timeline: cannot start the writer thread: ") + e.what());
  }
  active_.store(true, std::memory_order_release);
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> life(lifecycle_mu_);
  StopLocked();
}

void Timeline::StopLocked() {
  if (!writer_.joinable()) return;
  active_.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Close what the engine left open so every row's B/E pairs balance in a
    // cleanly stopped file; the latest Begin is closed first.
    const std::string body = "{\"ph\":\"E\",\"args\":{\"unfinished\":true}";
    auto close_row = [&](Row* row) {
      while (!row->open.empty()) {
        if (row->open.back() && !failed_) AppendEventLocked(body, row->tid);
        row->open.pop_back();
      }
    };
    for (auto& kv : rows_) close_row(&kv.second);
    open_ = false;
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();
  // A stopped timeline holds no memory: the event buffer's capacity is what a
  // burst (or a descheduled writer) left, and the row table grows with every
  // tensor name seen while recording.
  std::lock_guard<std::mutex> lock(mu_);
  std::string().swap(pending_);
  std::unordered_map<std::string, Row>().swap(rows_);
}

std::string Timeline::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}

TimelineStats Timeline::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Timeline::Begin(const std::string& row, const char* phase, const std::string& args_json) {
  if (!active()) return;
  Record(&row, -1, 'B', phase, args_json);
}

void Timeline::End(const std::string& row, const char* phase, const std::string& args_json) {
  if (!active()) return;
  Record(&row, -1, 'E', phase, args_json);
}

void Timeline::Instant(const std::string& row, const char* name, const std::string& args_json) {
  if (!active()) return;
  Record(&row, -1, 'i', name, args_json);
}

void Timeline::MarkCycle() {
  if (!active()) return;
  static const std::string kNoArgs;
  Record(nullptr, kCycleTid, 'i', "CYCLE_START", kNoArgs);
}

void Timeline::Record(const std::string* tensor, int64_t fixed_tid, char ph, const char* name,
                      const std::string& args_json) {
  // Everything that needs no shared state is formatted before taking the lock.
  thread_local std::string body;
  body.clear();
  body.append("{\"name\":");
  if (name == nullptr) name = "";
  AppendQuoted(&body, name, std::strlen(name));
  body.append(",\"ph\":\"");
  body.push_back(ph);
  body.push_back('"');
  if (ph == 'i') body.append(",\"s\":\"t\"");
  if (!args_json.empty()) {
    body.append(",\"args\":{");
    body.append(args_json);
    body.push_back('}');
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return;  // raced with Stop
  if (failed_) {
    ++stats_.events_dropped;
    return;
  }
  Row* row = RowLocked(tensor, fixed_tid);
  bool keep;
  if (ph == 'E') {
    if (row->open.empty()) {
      ++stats_.unmatched_ends;
      return;
    }
    // An End follows its Begin's fate, so dropping never unbalances a row
    // (an End may overshoot the limit by the few Begins that are open).
    keep = row->open.back() != 0;
    row->open.pop_back();
  } else {
    keep = !OverLimitLocked();
    if (ph == 'B') row->open.push_back(keep ? 1 : 0);
  }
  if (!keep) {
    ++stats_.events_dropped;
    return;
  }
  if (!row->named) {
    if (tensor != nullptr) {
      NameRowLocked(row, *tensor, row->tid);
    } else {
      NameRowLocked(row, kCycleRowName, -2);
    }
  }
  AppendEventLocked(body, row->tid);
  ++stats_.events_written;
}

Timeline::Row* Timeline::RowLocked(const std::string* tensor, int64_t fixed_tid) {
  if (tensor == nullptr) return fixed_tid == kCycleTid ? &cycle_row_ : &notice_row_;
  auto it = rows_.find(*tensor);
  if (it == rows_.end()) {
    it = rows_.emplace(*tensor, Row()).first;
    it->second.tid = next_tid_++;
  }
  return &it->second;
}

void Timeline::NameRowLocked(Row* row, const std::string& label, int64_t sort_index) {
  pending_.append(",\n");
  AppendMetadata(&pending_, "thread_name", rank_, row->tid, "\"name\":" + JsonQuote(label));
  pending_.append(",\n");
  AppendMetadata(&pending_, "thread_sort_index", rank_, row->tid,
                 "\"sort_index\":" + std::to_string(sort_index));
  row->named = true;
}

bool Timeline::OverLimitLocked() const {
  const size_t queued = pending_.size() + in_flight_;
  if (queued >= options_.max_pending_bytes) return true;
  return options_.max_file_bytes != 0 &&
         stats_.bytes_written + queued >= options_.max_file_bytes;
}

int64_t Timeline::NowMicrosLocked() const {
  // steady_clock, so an NTP step mid-run cannot put an End before its Begin.
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now() - mono0_).count();
}

void Timeline::AppendEventLocked(const std::string& body, int64_t tid) {
  const size_t before = pending_.size();
  // The separator goes before each event, so a file cut anywhere between
  // events ends in `}` and needs only a `]`, which readers may omit.
  pending_.append(",\n");
  pending_.append(body);
  pending_.append(",\"ts\":");
  AppendInt(&pending_, NowMicrosLocked());
  pending_.append(",\"pid\":");
  AppendInt(&pending_, rank_);
  pending_.append(",\"tid\":");
  AppendInt(&pending_, tid);
  pending_.push_back('}');
  if (before < kWakeBytes && pending_.size() >= kWakeBytes) wake_.notify_one();
}

void Timeline::AppendDropNoticeLocked(bool stopping) {
  const uint64_t dropped = stats_.events_dropped;
  if (dropped == dropped_reported_ || failed_) return;
  const bool file_full = options_.max_file_bytes != 0 &&
                         stats_.bytes_written + pending_.size() + in_flight_ >=
                             options_.max_file_bytes;
  // A full file would otherwise gain a notice every interval until Stop.
  if (file_full && file_limit_noticed_ && !stopping) return;
  if (file_full) file_limit_noticed_ = true;

  if (!notice_row_.named) NameRowLocked(&notice_row_, kNoticeRowName, -1);
  std::string body = "{\"name\":\"TIMELINE_EVENTS_DROPPED\",\"ph\":\"i\",\"s\":\"p\",\"args\":{";
  body.append("\"dropped_total\":");
  AppendInt(&body, static_cast<int64_t>(dropped));
  body.append(",\"dropped_since_last_notice\":");
  AppendInt(&body, static_cast<int64_t>(dropped - dropped_reported_));
  body.append(",\"reason\":");
  body.append(file_full ? "\"file size limit reached (max_file_bytes)\""
                        : "\"writer fell behind (max_pending_bytes)\"");
  body.push_back('}');
  AppendEventLocked(body, notice_row_.tid);
  dropped_reported_ = dropped;
}

void Timeline::WriterMain() {
  std::string out;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait_for(lock, options_.flush_interval,
                   [this] { return stopping_ || pending_.size() >= kWakeBytes; });
    const bool stopping = stopping_;
    AppendDropNoticeLocked(stopping);
    out.swap(pending_);
    pending_.clear();
    in_flight_ = out.size();
    const int fd = fd_;
    const bool failed = failed_;
    lock.unlock();

    // The disk is touched only here, never under the lock.
    int err = 0;
    if (!failed && !out.empty()) err = WriteAll(fd, out.data(), out.size());
    const char kClose[] = "\n]\n";
    if (!failed && err == 0 && stopping) err = WriteAll(fd, kClose, sizeof(kClose) - 1);
    const size_t written = out.size() + (stopping ? sizeof(kClose) - 1 : 0);
    if (out.capacity() > 4 * kWakeBytes) std::string().swap(out);  // give a burst's memory back
    out.clear();

    lock.lock();
    in_flight_ = 0;
    if (err != 0) {
      failed_ = true;
      std::fprintf(stderr, "hvdlite: timeline: writing '%s' failed (%s); recording stops\n",
                   path_.c_str(), OsError(err).c_str());
    } else if (!failed) {
      stats_.bytes_written += written;
    }
    if (stopping) {
      ::close(fd_);
      fd_ = -1;
      stopping_ = false;
      return;
    }
  }
}

}  // namespace hvdlite

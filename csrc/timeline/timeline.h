// Per-rank Chrome trace (JSON array format) of what the engine does to each
// tensor. Callers never wait for the disk: events are appended to a memory
// buffer under a short mutex and a writer thread flushes it twenty times a
// second, so a SIGKILLed run still leaves a file that chrome://tracing and
// Perfetto open (the array format allows the closing `]` to be missing).
// The process (pid = rank) carries the wall-clock start time in its metadata
// (start_time_since_epoch_in_micros); event times are microseconds since it.
// Row and phase names are the callers' (timeline_names.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/json_text.h"  // JsonQuote, for building args_json
#include "common/status.h"

namespace hvdlite {

struct TimelineOptions {
  // Events waiting for the writer beyond this are dropped (and counted) rather
  // than letting a stalled disk grow the process without bound.
  size_t max_pending_bytes = size_t{64} << 20;
  // Stop recording new events once the file reaches this size; 0 = no limit.
  uint64_t max_file_bytes = 0;
  // Upper bound on what a SIGKILL loses, and on how long an event takes to
  // reach the file (tools may read it while the run goes on).
  std::chrono::milliseconds flush_interval{50};
};

struct TimelineStats {
  uint64_t events_written = 0;  // accepted into the file (metadata excluded)
  uint64_t events_dropped = 0;  // over max_pending_bytes / max_file_bytes, or after a write error
  uint64_t unmatched_ends = 0;  // End() with no open Begin() on that row: a caller bug
  uint64_t bytes_written = 0;   // in the current (or last) file
};

class Timeline {
 public:
  explicit Timeline(TimelineOptions options = TimelineOptions());
  ~Timeline();  // stops
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // `path` may contain %r, replaced by `rank`. Fails (Status::InvalidArgument
  // with a message naming the path and the OS error) if the file cannot be
  // created. Truncates an existing file. On an active timeline it switches to
  // the new file (the old one is closed properly) only if the new one opens.
  Status Start(const std::string& path, int rank);
  // Closes rows left open (End with "unfinished":true), writes the closing
  // bracket, joins the writer thread. No-op when not active.
  void Stop();
  bool active() const { return active_.load(std::memory_order_acquire); }

  // Events on the row labelled `row` (one per label, e.g. a tensor's). `args_json` is
  // either empty or a JSON object body without braces, copied verbatim, e.g.
  // "\"dtype\":\"float32\",\"shape\":[2,3]". All calls are thread-safe and
  // are no-ops while not active. An End() closes the row's latest Begin().
  void Begin(const std::string& row, const char* phase, const std::string& args_json = "");
  void End(const std::string& row, const char* phase, const std::string& args_json = "");
  void Instant(const std::string& row, const char* name, const std::string& args_json = "");
  void MarkCycle();  // an instant "CYCLE_START" on a dedicated row

  TimelineStats stats() const;
  std::string path() const;  // the file of the current (or last) Start, %r expanded

 private:
  struct Row {
    int64_t tid = 0;
    bool named = false;      // thread_name metadata written
    std::vector<char> open;  // per open Begin: 1 written, 0 dropped
  };

  void Record(const std::string* tensor, int64_t fixed_tid, char ph, const char* name,
              const std::string& args_json);
  Row* RowLocked(const std::string* tensor, int64_t fixed_tid);
  void NameRowLocked(Row* row, const std::string& label, int64_t sort_index);
  bool OverLimitLocked() const;
  void AppendEventLocked(const std::string& body, int64_t tid);
  void AppendDropNoticeLocked(bool stopping);
  int64_t NowMicrosLocked() const;
  void StopLocked();  // lifecycle_mu_ held
  void WriterMain();

  const TimelineOptions options_;
  std::atomic<bool> active_{false};

  std::mutex lifecycle_mu_;  // serialises Start/Stop
  std::thread writer_;

  mutable std::mutex mu_;  // everything below
  std::condition_variable wake_;
  int fd_ = -1;
  std::string path_;
  int rank_ = 0;
  bool open_ = false;      // accepting events
  bool stopping_ = false;  // writer: final flush, then `]`
  bool failed_ = false;    // a write failed; drop everything until Stop
  std::string pending_;
  size_t in_flight_ = 0;  // bytes the writer is writing now, counted against the limits
  std::unordered_map<std::string, Row> rows_;
  Row cycle_row_, notice_row_;
  int64_t next_tid_ = 0;
  std::chrono::steady_clock::time_point mono0_;  // Start: event times count from here
  uint64_t dropped_reported_ = 0;
  bool file_limit_noticed_ = false;
  TimelineStats stats_;
};

}  // namespace hvdlite

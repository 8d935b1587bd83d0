// Standalone test of csrc/timeline/timeline.cc: usage `test_timeline <scratch dir>`.
// Exits non-zero on the first failed check. JSON validity is judged by
// python3's json module (the strictest reader at hand), run on each file.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "timeline/timeline.h"

using hvdlite::Timeline;
using hvdlite::TimelineOptions;

namespace {

std::string g_dir;
int g_failures = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                 \
      ++g_failures;                                                        \
    }                                                                      \
  } while (0)

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loads the file as JSON (appending `]` when `killed`: the array format's
// optional bracket) and checks B/E nesting per row; prints a summary line.
const char kChecker[] = R"PY(
import json, sys, time
path, mode = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8").read()
if mode == "killed":
    assert not text.rstrip().endswith("]"), "a killed writer cannot have closed the array"
    assert text.rstrip().endswith("}"), "a cut file must end after a whole event: %r" % text[-40:]
    text += "]"
events = json.loads(text)
assert isinstance(events, list) and events, "not a non-empty array"
# Event times count from the wall-clock start in the process metadata.
start = [e["args"]["start_time_since_epoch_in_micros"] for e in events
         if e["ph"] == "M" and e["name"] == "process_name"]
assert len(start) == 1 and abs(start[0] - time.time() * 1e6) < 3600e6, start
depth, names, ts = {}, {}, []
for e in events:
    key = (e["pid"], e["tid"])
    if e["ph"] == "M":
        if e["name"] == "thread_name":
            names[key] = e["args"]["name"]
        continue
    assert key in names, "row %r used before its thread_name" % (key,)
    ts.append(e["ts"])
    if e["ph"] == "B":
        depth[key] = depth.get(key, 0) + 1
    elif e["ph"] == "E":
        depth[key] = depth.get(key, 0) - 1
        assert depth[key] >= 0, "E without B on %r" % names[key]
open_rows = {names[k]: d for k, d in depth.items() if d}
if mode == "killed":
    # The cut leaves at most the phases open that the writer nests (2 below).
    assert all(d <= 2 for d in open_rows.values()), open_rows
else:
    assert not open_rows, "unbalanced rows: %r" % open_rows
assert ts == sorted(ts), "timestamps go backwards in file order"
assert not ts or (ts[0] >= 0 and ts[-1] < 600e6), "times are not counted from the start"
print("events=%d rows=%d span_us=%d" % (len(ts), len(names), max(ts) - min(ts) if ts else 0))
)PY";

// Runs the checker; returns its stdout line ("" on failure).
std::string PyCheck(const std::string& path, const char* mode) {
  static std::string script;
  if (script.empty()) {
    script = g_dir + "/check_timeline.py";
    std::ofstream(script) << kChecker;
  }
  std::string out_path = path + ".check";
  std::string cmd = "python3 '" + script + "' '" + path + "' " + mode + " > '" + out_path + "'";
  int rc = std::system(cmd.c_str());
  std::string line = ReadFile(out_path);
  std::printf("  %s: %s", path.c_str(), rc == 0 ? line.c_str() : "INVALID\n");
  if (rc != 0) return "";
  return line;
}

long SpanMicros(const std::string& line) {
  auto pos = line.find("span_us=");
  return pos == std::string::npos ? -1 : std::atol(line.c_str() + pos + 8);
}

bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A child records continuously and is SIGKILLed after ~1.5 s: the file must
// be valid JSON once the optional `]` is added and hold more than 1 s.
void TestSigkill() {
  std::printf("sigkill\n");
  const std::string path = g_dir + "/killed-1.json";
  std::fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    Timeline tl;
    if (!tl.Start(g_dir + "/killed-%r.json", 1).ok()) _exit(3);
    for (long i = 0;; ++i) {
      tl.MarkCycle();
      for (int t = 0; t < 4; ++t) {
        const std::string name = "grad/layer" + std::to_string(t);
        tl.Begin(name, "NEGOTIATE_ALLREDUCE");
        tl.End(name, "NEGOTIATE_ALLREDUCE");
        tl.Begin(name, "MPI_ALLREDUCE", "\"step\":" + std::to_string(i));
        tl.Begin(name, "MEMCPY_IN_FUSION_BUFFER");
        tl.End(name, "MEMCPY_IN_FUSION_BUFFER");
        tl.End(name, "MPI_ALLREDUCE");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  CHECK(child > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  std::string line = PyCheck(path, "killed");
  CHECK(!line.empty());
  CHECK(SpanMicros(line) > 1000000);
}

void TestThreadsAndEscaping() {
  std::printf("threads and escaping\n");
  Timeline tl;
  CHECK(!tl.active());
  CHECK(tl.Start(g_dir + "/threads-%r.json", 3).ok());
  CHECK(tl.active());
  CHECK(tl.path() == g_dir + "/threads-3.json");
  std::vector<std::thread> threads;
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&tl, k] {
      for (int i = 0; i < 2000; ++i) {
        const std::string name = "t" + std::to_string(k) + "/w" + std::to_string(i % 7);
        tl.Begin(name, "QUEUE");
        tl.End(name, "QUEUE");
        tl.Begin(name, "MPI_ALLREDUCE");
        tl.End(name, "MPI_ALLREDUCE", "\"dtype\":\"float32\",\"shape\":[2,3]");
        if (i % 100 == 0) tl.MarkCycle();
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::string weird = std::string("q\"uote\\back\nnl\ttab\x01 \xc3\xbc ok \xff\xfe bad");
  tl.Begin(weird, "NEGOTIATE_ALLREDUCE");
  tl.End(weird, "NEGOTIATE_ALLREDUCE");
  tl.Instant(weird, "READY", "\"rank\":3");
  tl.Begin("left open", "MPI_ALLGATHER");  // Stop must close it
  tl.End("never begun", "QUEUE");          // dropped, counted
  tl.Stop();
  CHECK(!tl.active());
  tl.Begin("after stop", "QUEUE");  // no-op
  auto st = tl.stats();
  CHECK(st.events_written == 3 * 2000 * 4 + 3 * 20 + 3 + 1);
  CHECK(st.events_dropped == 0);
  CHECK(st.unmatched_ends == 1);
  const std::string path = g_dir + "/threads-3.json";
  CHECK(!PyCheck(path, "complete").empty());
  const std::string text = ReadFile(path);
  CHECK(Contains(text, "\"q\\\"uote\\\\back\\nnl\\ttab\\u0001 \xc3\xbc ok \\ufffd\\ufffd bad\""));
  CHECK(Contains(text, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":3,\"tid\":0,\"args\":{\"name\":\"rank 3\","
                       "\"start_time_since_epoch_in_micros\":"));
  CHECK(Contains(text, "\"unfinished\":true"));
  CHECK(!Contains(text, "after stop"));
  CHECK(text.size() == st.bytes_written);
  CHECK(hvdlite::JsonQuote("a\"b") == "\"a\\\"b\"");
}

void TestRestartAndFailure() {
  std::printf("restart and start failure\n");
  Timeline tl;
  const std::string a = g_dir + "/restart-a.json", b = g_dir + "/restart-b-%r.json";
  CHECK(tl.Start(a, 0).ok());
  tl.Begin("x", "QUEUE");
  // A bad path while active: an error naming path and cause; `a` keeps recording.
  hvdlite::Status bad = tl.Start(g_dir + "/no/such/dir/tl-%r.json", 0);
  CHECK(!bad.ok());
  CHECK(bad.kind() == hvdlite::ErrorKind::kInvalidArgument);
  CHECK(Contains(bad.message(), g_dir + "/no/such/dir/tl-0.json"));
  CHECK(Contains(bad.message(), "No such file or directory"));
  std::printf("  error message: %s\n", bad.message().c_str());
  CHECK(tl.active());
  tl.End("x", "QUEUE");
  CHECK(tl.Start(b, 7).ok());  // switches files
  tl.Begin("y", "QUEUE");
  tl.End("y", "QUEUE");
  tl.Stop();
  tl.Stop();
  CHECK(tl.Start(a, 0).ok());  // the same file again, started fresh
  CHECK(tl.Start(a, 0).ok());  // and again while active on that very file
  tl.Instant("z", "HELLO");
  tl.Stop();
  CHECK(!PyCheck(a, "complete").empty());
  CHECK(!PyCheck(g_dir + "/restart-b-7.json", "complete").empty());
  CHECK(Contains(ReadFile(a), "HELLO"));
  CHECK(!Contains(ReadFile(a), "QUEUE"));
}

// Tools may read the file while the run goes on (Horovod's writer puts each
// event out at once): an event reaches the file while the timeline is still
// recording, with no later event and no Stop() to push it out. The bound is a
// guard against a hang, far above the flush interval, not a time being tested.
void TestLiveReading() {
  std::printf("events reach the file while recording\n");
  Timeline tl;
  const std::string path = g_dir + "/live.json";
  CHECK(tl.Start(path, 0).ok());
  tl.Begin("allreduce.live", "NEGOTIATE_ALLREDUCE");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool visible = false;
  while (!(visible = Contains(ReadFile(path), "NEGOTIATE_ALLREDUCE")) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(visible);
  CHECK(tl.active());
  tl.Stop();
}

// A writer that cannot keep up (here: one that waits 10 s between flushes
// and a tiny buffer) drops events, keeps rows balanced, and says so.
void TestDrops() {
  std::printf("drops when the writer falls behind\n");
  TimelineOptions opt;
  opt.max_pending_bytes = 16 << 10;
  opt.flush_interval = std::chrono::seconds(10);
  Timeline tl(opt);
  CHECK(tl.Start(g_dir + "/drops.json", 0).ok());
  for (int i = 0; i < 5000; ++i) {
    const std::string name = "g" + std::to_string(i % 5);
    tl.Begin(name, "MPI_ALLREDUCE");
    tl.Begin(name, "MEMCPY_IN_FUSION_BUFFER");
    tl.End(name, "MEMCPY_IN_FUSION_BUFFER");
    tl.End(name, "MPI_ALLREDUCE");
  }
  tl.Stop();
  auto st = tl.stats();
  std::printf("  written=%llu dropped=%llu\n", (unsigned long long)st.events_written,
              (unsigned long long)st.events_dropped);
  CHECK(st.events_dropped > 0);
  CHECK(st.events_written + st.events_dropped == 20000);
  const std::string path = g_dir + "/drops.json";
  CHECK(!PyCheck(path, "complete").empty());
  CHECK(Contains(ReadFile(path), "\"dropped_total\":" + std::to_string(st.events_dropped)));
}

void TestFileLimit() {
  std::printf("file size limit\n");
  TimelineOptions opt;
  opt.max_file_bytes = 64 << 10;
  opt.flush_interval = std::chrono::milliseconds(20);
  Timeline tl(opt);
  CHECK(tl.Start(g_dir + "/limited.json", 0).ok());
  for (int i = 0; i < 20000; ++i) {
    tl.Begin("g", "MPI_ALLREDUCE");
    tl.End("g", "MPI_ALLREDUCE");
    if (i % 2000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  tl.Stop();
  const std::string path = g_dir + "/limited.json";
  const std::string text = ReadFile(path);
  std::printf("  size=%zu dropped=%llu\n", text.size(),
              (unsigned long long)tl.stats().events_dropped);
  CHECK(text.size() < (64 << 10) + 4096);
  CHECK(Contains(text, "file size limit reached"));
  CHECK(!PyCheck(path, "complete").empty());
}

// Cost on the caller's thread (the engine's), for the record.
void Benchmark() {
  std::printf("cost per event\n");
  Timeline tl;
  CHECK(tl.Start(g_dir + "/bench.json", 0).ok());
  std::vector<std::string> names;
  for (int i = 0; i < 161; ++i) names.push_back("DistributedOptimizer.Allreduce.grad_" + std::to_string(i));
  const int kRounds = 300;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kRounds; ++r) {
    for (const auto& n : names) {
      tl.Begin(n, "MPI_ALLREDUCE");
      tl.End(n, "MPI_ALLREDUCE", "\"dtype\":\"float32\",\"shape\":[64,3,7,7]");
    }
  }
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  tl.Stop();
  const double events = 2.0 * kRounds * names.size();
  std::printf("  %.0f ns per event over %.0f events (dropped %llu)\n", ns / events, events,
              (unsigned long long)tl.stats().events_dropped);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scratch dir>\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  TestSigkill();  // first: fork while this process has no other threads
  TestThreadsAndEscaping();
  TestRestartAndFailure();
  TestLiveReading();
  TestDrops();
  TestFileLimit();
  Benchmark();
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("all timeline checks passed\n");
  return 0;
}

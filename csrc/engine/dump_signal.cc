#include "engine/dump_signal.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace hvdlite {

namespace {

// A signal handler reaches nothing but static storage: the write end of the
// running DumpSignal's pipe (-1: none). The one piece of process-wide state
// here, owned by that object while it runs.
std::atomic<int> g_wake_fd{-1};
struct sigaction g_previous;

constexpr char kDump = 'd';
constexpr char kQuit = 'q';

void OnSignal(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const char c = kDump;
    ssize_t ignored = write(fd, &c, 1);  // a full pipe already holds a dump request
    (void)ignored;
  }
  errno = saved;
  // The handler that was there goes on working: MPICH's own (it counts
  // SIGUSR1 from its process manager as news of a failed process), or the
  // program's (Python's signal.signal).
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
}

}  // namespace

bool DumpSignal::Start(std::function<void()> dump) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  fcntl(fds[1], F_SETFL, O_NONBLOCK);  // the handler must never block
  int expected = -1;
  if (!g_wake_fd.compare_exchange_strong(expected, fds[1])) {  // another engine has it
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  dump_ = std::move(dump);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hvdlite-dump");
    // This thread must not take the signal itself: its read() would restart
    // fine, but the process's other threads are the handler's place.
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    while (true) {
      char c = 0;
      const ssize_t n = read(read_fd_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == kQuit || quit_.load()) return;
      dump_();
    }
  });
  struct sigaction action = {};
  action.sa_sigaction = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGUSR1, nullptr, &g_previous);  // complete before the handler can run
  sigaction(SIGUSR1, &action, nullptr);
  installed_ = true;
  return true;
}

void DumpSignal::Stop() {
  if (!installed_) return;
  installed_ = false;
  // A signal from now on finds no pipe; the previous action comes back,
  // unless the program replaced this one meanwhile.
  g_wake_fd.store(-1);
  struct sigaction current;
  if (sigaction(SIGUSR1, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
      current.sa_sigaction == OnSignal) {
    sigaction(SIGUSR1, &g_previous, nullptr);
  }
  quit_.store(true);  // in case the pipe is full of requests and the byte below does not fit
  const char c = kQuit;
  ssize_t ignored = write(write_fd_, &c, 1);
  (void)ignored;
  if (thread_.joinable()) thread_.join();
  close(read_fd_);
  close(write_fd_);
  read_fd_ = write_fd_ = -1;
}

}  // namespace hvdlite

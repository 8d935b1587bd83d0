#include "transport/socket/socket_connect.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

namespace hvdlite {

namespace {

// One address's connection attempt: not started (fd -1, no failure),
// pending (fd >= 0) or failed (fd -1, failure says why).
struct Attempt {
  int fd = -1;
  double started = 0.0;
  std::string failure;
};

void Fail(Attempt* a, const std::string& why) {
  if (a->fd >= 0) close(a->fd);
  a->fd = -1;
  a->failure = why;
}

void Start(Attempt* a, uint32_t address, uint16_t port, double now) {
  a->started = now;
  a->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (a->fd < 0) {
    Fail(a, std::string("socket: ") + std::strerror(errno));
    return;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = static_cast<in_port_t>(port);
  to.sin_addr.s_addr = address;
  // Connected at once (loopback) or in progress: either way poll(2) reports
  // the outcome, so both stay pending here.
  if (connect(a->fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 && errno != EINPROGRESS) {
    Fail(a, std::strerror(errno));
  }
}

// The next attempt may start once the last one has had its head start, or
// at once when every attempt so far has failed.
bool MayStartNext(const std::vector<Attempt>& attempts, size_t started, double now, double stagger) {
  if (started == 0) return true;
  if (now >= attempts[started - 1].started + stagger) return true;
  return std::none_of(attempts.begin(), attempts.begin() + static_cast<long>(started),
                      [](const Attempt& a) { return a.fd >= 0; });
}

std::string Where(uint32_t address, uint16_t port) {
  char text[INET_ADDRSTRLEN] = "?";
  in_addr a{};
  a.s_addr = address;
  inet_ntop(AF_INET, &a, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(port));
}

// Waits for the pending attempts until `wake`; returns the index of the
// first (lowest) that connected, or -1. Attempts that failed are marked.
int AwaitOne(std::vector<Attempt>* attempts, double now, double wake) {
  std::vector<pollfd> fds;
  std::vector<size_t> index;
  for (size_t k = 0; k < attempts->size(); ++k) {
    if ((*attempts)[k].fd >= 0) {
      fds.push_back(pollfd{(*attempts)[k].fd, POLLOUT, 0});
      index.push_back(k);
    }
  }
  const int ms = static_cast<int>(std::ceil(std::max(0.0, wake - now) * 1000));
  if (fds.empty() || poll(fds.data(), fds.size(), ms) <= 0) return -1;
  int connected = -1;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    Attempt& a = (*attempts)[index[i]];
    int soft_error = 0;
    socklen_t len = sizeof(soft_error);
    if (getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &soft_error, &len) != 0) soft_error = errno;
    if (soft_error != 0) {
      Fail(&a, std::strerror(soft_error));
    } else if (connected < 0) {
      connected = static_cast<int>(index[i]);
    }
  }
  return connected;
}

}  // namespace

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int ConnectToFirst(const std::vector<uint32_t>& addresses, uint16_t port, const SocketConnectOptions& options,
                   int* which, std::string* error) {
  if (addresses.empty()) {
    *error = "the neighbour has no IPv4 address to connect to";
    return -1;
  }
  std::vector<Attempt> attempts(addresses.size());
  size_t started = 0;
  int winner = -1;
  while (winner < 0) {
    const double now = SteadySeconds();
    while (started < addresses.size() && now < options.deadline &&
           MayStartNext(attempts, started, now, options.stagger_seconds)) {
      Start(&attempts[started], addresses[started], port, now);
      ++started;
    }
    double wake = options.deadline;
    if (started > 0 && started < addresses.size()) {
      wake = std::min(wake, attempts[started - 1].started + options.stagger_seconds);
    }
    bool pending = false;
    for (size_t k = 0; k < started; ++k) {
      if (attempts[k].fd < 0) continue;
      const double expiry = std::min(options.deadline, attempts[k].started + options.per_address_seconds);
      if (now >= expiry) {
        Fail(&attempts[k], "no answer in time");
      } else {
        pending = true;
        wake = std::min(wake, expiry);
      }
    }
    if (!pending && (started == addresses.size() || now >= options.deadline)) break;
    winner = AwaitOne(&attempts, now, wake);
  }
  for (size_t k = 0; k < attempts.size(); ++k) {
    if (static_cast<int>(k) != winner && attempts[k].fd >= 0) close(attempts[k].fd);
  }
  if (winner >= 0) {
    if (which != nullptr) *which = winner;
    return attempts[static_cast<size_t>(winner)].fd;
  }
  *error = "could not connect to ";
  for (size_t k = 0; k < attempts.size(); ++k) {
    const std::string why = k < started ? attempts[k].failure : "not tried before the deadline";
    *error += (k == 0 ? "" : ", ") + Where(addresses[k], port) + " (" + why + ")";
  }
  return -1;
}

}  // namespace hvdlite

// Checks of ConnectToFirst (transport/socket/socket_connect.h), the ring's
// connection to a neighbour that offers several addresses, on loopback
// listeners: the first address that answers is taken when several do; an
// address that never answers does not keep the next one from connecting
// before the deadline (a listener whose accept queue is full drops the
// handshake, as a firewall or an unreachable network does); refused
// addresses and a passed deadline fail with each address and why.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "check.h"
#include "transport/socket/socket_connect.h"

using namespace hvdlite;

namespace {

uint32_t Loopback(int last) { return htonl((127u << 24) | static_cast<uint32_t>(last)); }

// A nonblocking listening socket on 127.0.0.<last>:port (port 0: an ephemeral one);
// `*port` (network order) is where it listens.
int ListenOn(int last, uint16_t* port, int backlog) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);  // accept(2) never waits
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = Loopback(last);
  at.sin_port = *port;
  socklen_t len = sizeof(at);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    CHECK(false, "listening on 127.0.0.%d failed", last);
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = at.sin_port;
  return fd;
}

// Whether a connection waits in `listener`'s queue (taken and closed):
// which listener a client reached.
bool Queued(int listener) {
  int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return false;
  close(fd);
  return true;
}

void TestTheFirstThatAnswersWins() {
  uint16_t port = 0;
  const int one = ListenOn(1, &port, 16);
  const int two = ListenOn(2, &port, 16);
  for (int first : {1, 2}) {
    SocketConnectOptions options;
    options.deadline = SteadySeconds() + 10.0;
    int which = -1;
    std::string error;
    const int fd = ConnectToFirst({Loopback(first), Loopback(3 - first)}, port, options, &which, &error);
    CHECK(fd >= 0 && which == 0, "both answer, 127.0.0.%d first: took address %d (%s)", first, which, error.c_str());
    usleep(50 * 1000);  // the handshake reaches the listener's queue
    const bool reached_first = Queued(first == 1 ? one : two), reached_second = Queued(first == 1 ? two : one);
    CHECK(reached_first && !reached_second, "127.0.0.%d first: the first listener %s, the second %s", first,
          reached_first ? "was reached" : "was not reached", reached_second ? "was reached too" : "was not");
    if (fd >= 0) close(fd);
  }
  close(one);
  close(two);
}

void TestASilentAddressDoesNotHoldUpTheNext() {
  uint16_t port = 0;
  const int silent = ListenOn(2, &port, 0);
  const int open = ListenOn(1, &port, 16);
  // Fill the silent listener's accept queue: the kernel now drops the
  // handshakes that reach it, and connecting there waits, unanswered.
  const int filler = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = port;
  to.sin_addr.s_addr = Loopback(2);
  CHECK(connect(filler, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0, "filling the silent queue failed");
  SocketConnectOptions options;
  options.per_address_seconds = 5.0;
  options.deadline = SteadySeconds() + 3.0;  // less than one address's wait: one after another would fail
  int which = -1;
  std::string error;
  const int fd = ConnectToFirst({Loopback(2), Loopback(1)}, port, options, &which, &error);
  CHECK(fd >= 0 && which == 1, "the silent first address kept the second from connecting: %s", error.c_str());
  if (fd >= 0) close(fd);
  close(filler);
  close(silent);
  close(open);
}

void TestRefusedAndLateSayWhy() {
  uint16_t port = 0;
  const int listener = ListenOn(1, &port, 1);
  close(listener);  // nothing listens on the port now
  SocketConnectOptions options;
  options.deadline = SteadySeconds() + 10.0;
  std::string error;
  int fd = ConnectToFirst({Loopback(1), Loopback(2)}, port, options, nullptr, &error);
  const std::string p = std::to_string(ntohs(port));
  CHECK(fd < 0 && error == "could not connect to 127.0.0.1:" + p + " (Connection refused), 127.0.0.2:" + p +
                                " (Connection refused)",
        "refused: fd %d, error '%s'", fd, error.c_str());
  options.deadline = SteadySeconds() - 1.0;
  error.clear();
  fd = ConnectToFirst({Loopback(1)}, port, options, nullptr, &error);
  CHECK(fd < 0 && error == "could not connect to 127.0.0.1:" + p + " (not tried before the deadline)",
        "late: fd %d, error '%s'", fd, error.c_str());
  error.clear();
  fd = ConnectToFirst({}, port, options, nullptr, &error);
  CHECK(fd < 0 && error == "the neighbour has no IPv4 address to connect to", "none: '%s'", error.c_str());
}

}  // namespace

int main() {
  return hvdlite_test::RunTests({{"the_first_that_answers_wins", TestTheFirstThatAnswersWins},
                                 {"a_silent_address_does_not_hold_up_the_next", TestASilentAddressDoesNotHoldUpTheNext},
                                 {"refused_and_late_say_why", TestRefusedAndLateSayWhy}});
}

#include "transport/socket/socket_link.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "transport/socket/socket_connect.h"
#include "transport/socket/socket_ring_allreduce.h"

namespace hvdlite {

namespace {

constexpr int kMaxAddresses = 8;
// How long one address of the neighbour gets to accept a connection.
constexpr double kConnectSeconds = 5.0;

// What a rank tells the others over MPI: where it listens.
struct Endpoint {
  uint32_t port = 0;  // network order, as are the addresses
  uint32_t count = 0;
  uint32_t addresses[kMaxAddresses] = {};
};

// The first bytes on a connection, both ways: who is speaking, and the
// job's token, so a stray connection is not taken for the neighbour.
struct Hello {
  uint64_t token = 0;
  int32_t rank = -1;
  int32_t accepted = 0;  // the reply: 1 when the connection is taken
};

// Which network this process sees: its machine's boot and its network
// namespace. Ranks that share it reach each other on loopback.
struct NetworkPlace {
  char text[64] = {};
};

NetworkPlace Place() {
  NetworkPlace place;
  char boot[40] = {};
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (std::fgets(boot, sizeof(boot), f) == nullptr) boot[0] = 0;
    std::fclose(f);
  }
  struct stat ns {};
  const unsigned long long inode = stat("/proc/self/ns/net", &ns) == 0 ? ns.st_ino : 0;
  std::snprintf(place.text, sizeof(place.text), "%.36s/%llu", boot, inode);
  return place;
}

// Whether every rank of `comm` is in this process's network place; false
// if MPI failed.
bool SharesOneNetwork(MPI_Comm comm, int size, bool* one) {
  const NetworkPlace here = Place();
  std::vector<NetworkPlace> places(static_cast<size_t>(size));
  if (MPI_Allgather(&here, sizeof(here), MPI_BYTE, places.data(), sizeof(here), MPI_BYTE, comm) != MPI_SUCCESS) {
    return false;
  }
  *one = std::all_of(places.begin(), places.end(), [&](const NetworkPlace& p) {
    return std::strncmp(p.text, here.text, sizeof(here.text)) == 0;
  });
  return true;
}

std::string Failed(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// Moves exactly `n` bytes on a nonblocking socket before `deadline`.
bool Transfer(int fd, void* bytes, size_t n, bool writing, double deadline) {
  auto* p = static_cast<uint8_t*>(bytes);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = writing ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0 && !writing) return false;  // closed
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    const double left = deadline - SteadySeconds();
    if (left <= 0) return false;
    pollfd p_fd{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    poll(&p_fd, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
  }
  return true;
}

bool UpWithIPv4(const ifaddrs* i) {
  return i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP);
}

// "eth0, lo": the interfaces that could be named, for an error message.
std::string InterfacesUp(const ifaddrs* list) {
  std::vector<std::string> names;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (UpWithIPv4(i) && std::find(names.begin(), names.end(), i->ifa_name) == names.end()) {
      names.push_back(i->ifa_name);
    }
  }
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "none" : text;
}

// The IPv4 addresses this rank can be reached at: loopback only on one
// host; otherwise those of the named interfaces, in the order named, or of
// every interface that is up but loopback. Sets `error` (if empty) when there
// are none.
Endpoint LocalEndpoint(bool one_host, uint16_t port, const std::vector<std::string>& names, std::string* error) {
  Endpoint e;
  e.port = htons(port);
  if (one_host) {
    e.addresses[e.count++] = htonl(INADDR_LOOPBACK);
    return e;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    if (error->empty()) *error = Failed("listing the network interfaces");
    return e;
  }
  auto offer = [&](const char* wanted) {
    for (ifaddrs* i = list; i != nullptr && e.count < kMaxAddresses; i = i->ifa_next) {
      if (!UpWithIPv4(i)) continue;
      const bool taken = wanted == nullptr ? !(i->ifa_flags & IFF_LOOPBACK) : std::strcmp(i->ifa_name, wanted) == 0;
      if (taken) e.addresses[e.count++] = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    }
  };
  if (names.empty()) offer(nullptr);
  for (const std::string& name : names) offer(name.c_str());
  if (e.count == 0 && error->empty()) {
    std::string named;
    for (const std::string& name : names) named += (named.empty() ? "" : ",") + name;
    *error = names.empty() ? std::string("no IPv4 address on an interface that is up but loopback")
                           : "HVDLITE_SOCKET_IFNAME=" + named +
                                 ": no interface of these names is up with an IPv4 address (up here: " +
                                 InterfacesUp(list) + ")";
  }
  freeifaddrs(list);
  return e;
}

// Connects to the first of `peer`'s addresses that answers, and says hello.
int ConnectTo(const Endpoint& peer, const Hello& hello, double deadline, std::string* error) {
  SocketConnectOptions options;
  options.deadline = deadline;
  options.per_address_seconds = kConnectSeconds;
  const std::vector<uint32_t> addresses(peer.addresses, peer.addresses + std::min<uint32_t>(peer.count, kMaxAddresses));
  int fd = ConnectToFirst(addresses, static_cast<uint16_t>(peer.port), options, nullptr, error);
  if (fd >= 0 && !Transfer(fd, const_cast<Hello*>(&hello), sizeof(hello), true, deadline)) {
    *error = "connected to the right neighbour, but could not send it the hello";
    CloseFd(&fd);
  }
  return fd;
}

// Accepts connections until the left neighbour's hello arrives; answers it.
int AcceptFrom(int listener, int left, const Hello& mine, double deadline, std::string* error) {
  while (true) {
    const double wait = deadline - SteadySeconds();
    pollfd p{listener, POLLIN, 0};
    if (wait <= 0 || poll(&p, 1, static_cast<int>(wait * 1000) + 1) <= 0) {
      *error = "the left neighbour (ring rank " + std::to_string(left) + ") did not connect in time";
      return -1;
    }
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    Hello theirs;
    const bool heard = Transfer(fd, &theirs, sizeof(theirs), false, std::min(deadline, SteadySeconds() + kConnectSeconds));
    Hello reply = mine;
    reply.accepted = heard && theirs.token == mine.token && theirs.rank == left;
    if (reply.accepted && Transfer(fd, &reply, sizeof(reply), true, deadline)) return fd;
    close(fd);
  }
}

// A listening socket on an ephemeral port: loopback only, or every address.
int Listen(bool one_host, uint16_t* port, std::string* error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in here{};
  here.sin_family = AF_INET;
  here.sin_addr.s_addr = htonl(one_host ? INADDR_LOOPBACK : INADDR_ANY);
  socklen_t len = sizeof(here);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&here), sizeof(here)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&here), &len) != 0) {
    *error = Failed("listening socket");
    CloseFd(&fd);
  }
  *port = ntohs(here.sin_port);
  return fd;
}

// The same outcome on every rank: OK, or the first failing rank's reason.
Status AgreeOnOutcome(MPI_Comm comm, int rank, int size, std::string error) {
  int failed_rank = error.empty() ? size : rank;
  int first = size;
  if (MPI_Allreduce(&failed_rank, &first, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "socket ring: agreeing on the setup's outcome over MPI failed");
  }
  if (first == size) return Status::OK();
  std::vector<char> reason(256, 0);
  std::strncpy(reason.data(), error.c_str(), reason.size() - 1);
  MPI_Bcast(reason.data(), static_cast<int>(reason.size()), MPI_CHAR, first, comm);
  return Status::Error(ErrorKind::kMpi, "socket ring: ring rank " + std::to_string(first) + ": " + reason.data());
}

}  // namespace

Status SocketRingLink::Connect(MPI_Comm comm, const SocketLinkOptions& options,
                               std::unique_ptr<SocketRingLink>* out) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Every rank in one network namespace of one machine: loopback only.
  bool one_host = false;
  if (!SharesOneNetwork(comm, size, &one_host)) {
    return Status::Error(ErrorKind::kMpi, "socket ring: exchanging network places over MPI failed");
  }
  const double deadline = SteadySeconds() + (options.timeout_seconds > 0 ? options.timeout_seconds : 60.0);
  std::string error;
  uint16_t port = 0;
  int listener = Listen(one_host, &port, &error);
  Endpoint mine = LocalEndpoint(one_host, port, options.interfaces, &error);

  // Rank 0's token, and every rank's endpoint.
  uint64_t token = 0;
  if (rank == 0) {
    std::random_device random;
    token = (static_cast<uint64_t>(random()) << 32) ^ random();
  }
  std::vector<Endpoint> all(static_cast<size_t>(size));
  if (MPI_Bcast(&token, 8, MPI_BYTE, 0, comm) != MPI_SUCCESS ||
      MPI_Allgather(&mine, sizeof(Endpoint), MPI_BYTE, all.data(), sizeof(Endpoint), MPI_BYTE, comm) !=
          MPI_SUCCESS) {
    CloseFd(&listener);
    return Status::Error(ErrorKind::kMpi, "socket ring: exchanging endpoints over MPI failed");
  }
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  Hello hello;
  hello.token = token;
  hello.rank = rank;
  // Connect first (the neighbour's listener queues it), then accept, then
  // read the right neighbour's answer: no rank waits for one that waits.
  // Every rank tries, even after a failure above, and all learn whether all
  // connected before anyone waits to accept: a rank whose neighbour could
  // not reach it is not left waiting out the deadline.
  std::string connect_error;
  int right_fd = ConnectTo(all[static_cast<size_t>(right)], hello, deadline, &connect_error);
  if (error.empty()) error = connect_error;
  Status connected = AgreeOnOutcome(comm, rank, size, error);
  if (!connected.ok()) {
    CloseFd(&right_fd);
    CloseFd(&listener);
    return connected;
  }
  int left_fd = AcceptFrom(listener, left, hello, deadline, &error);
  CloseFd(&listener);
  if (right_fd >= 0) {
    Hello answer;
    if (!Transfer(right_fd, &answer, sizeof(answer), false, deadline) || answer.accepted != 1 ||
        answer.token != token || answer.rank != right) {
      if (error.empty()) error = "the right neighbour (ring rank " + std::to_string(right) + ") did not accept";
      CloseFd(&right_fd);
    }
  }
  Status agreed = AgreeOnOutcome(comm, rank, size, error);
  if (!agreed.ok()) {
    CloseFd(&right_fd);
    CloseFd(&left_fd);
    return agreed;
  }
  for (int fd : {right_fd, left_fd}) {  // nonblocking since they were made
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  }
  out->reset(new SocketRingLink(rank, size, right_fd, left_fd));
  return Status::OK();
}

Status NeighbourLost(const char* side, int neighbour, const std::string& how) {
  return Status::Error(ErrorKind::kTimeout, std::string("socket ring: the ") + side + " neighbour (ring rank " +
                                                std::to_string(neighbour) + ") " + how +
                                                ": it has probably died or left the job");
}

SocketRingLink::~SocketRingLink() { Close(); }

Status SocketRingLink::ClosedNeighbour() const {
  if (!broken_.ok()) return broken_;
  // POLLRDHUP: the peer's end is shut even with bytes of the next
  // collective still unread ahead of it.
  pollfd fds[2] = {{left_fd_, POLLRDHUP, 0}, {right_fd_, POLLRDHUP, 0}};
  if (left_fd_ < 0 || right_fd_ < 0 || poll(fds, 2, 0) <= 0) return Status::OK();
  const short gone = POLLRDHUP | POLLHUP | POLLERR;
  if (fds[0].revents & gone) return NeighbourLost("left", (rank_ + size_ - 1) % size_, "closed its connection");
  if (fds[1].revents & gone) return NeighbourLost("right", (rank_ + 1) % size_, "closed its connection");
  return Status::OK();
}

void SocketRingLink::Close() {
  CloseFd(&right_fd_);
  CloseFd(&left_fd_);
}

void SocketRingLink::Break(const Status& why) {
  if (!broken_.ok()) return;
  broken_ = why;
  // The neighbours' streams are lost too: closing tells them at once.
  Close();
}

void SocketRingLink::Leave(SocketRingAllreduceWork* work, const Status& why) {
  auto it = std::find(queue_.begin(), queue_.end(), work);
  if (it == queue_.end()) return;
  queue_.erase(it);
  Break(why.ok() ? Status::Error(ErrorKind::kInternal, "socket ring: a collective was dropped unfinished") : why);
}

void SocketRingLink::Advance() {
  while (!queue_.empty()) {
    if (!queue_.front()->Step()) return;
    queue_.pop_front();
  }
}

void SocketRingLink::Poll(int timeout_ms) {
  if (queue_.empty() || !broken_.ok()) return;
  const SocketRingAllreduceWork* head = queue_.front();
  pollfd fds[2];
  nfds_t n = 0;
  if (head->WantsSend()) fds[n++] = pollfd{right_fd_, POLLOUT, 0};
  if (head->WantsReceive()) fds[n++] = pollfd{left_fd_, POLLIN, 0};
  if (n > 0) poll(fds, n, timeout_ms);
}

}  // namespace hvdlite

// Opening the ring's connection to a neighbour that offers several IPv4
// addresses (one per interface) when some of them may not answer.
//
// Why side by side: a neighbour's address on a network this host cannot
// reach drops the connection attempt silently, and trying its addresses one
// after another would spend the per-address wait on each such address
// before the one that works (seconds per address, on every rank, at every
// setup). Address k starts `stagger_seconds` after address k-1 unless one
// has connected by then, so the first address still wins when several
// answer (the order is HVDLITE_SOCKET_IFNAME's), and an unreachable one
// delays the others by the stagger only (RFC 8305's "happy eyeballs").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvdlite {

struct SocketConnectOptions {
  double deadline = 0.0;          // steady-clock seconds (SteadySeconds()); nothing waits past it
  double per_address_seconds = 5.0;  // how long one address gets to accept
  double stagger_seconds = 0.25;  // head start of each address over the next
};

// Seconds on the steady clock, the time base of SocketConnectOptions::deadline.
double SteadySeconds();

// A connected, nonblocking TCP socket to the first of `addresses` (IPv4, in
// network order) at `port` (network order) that accepts, or -1 with `error`
// naming every address tried and why it failed. `*which` (if not null) is
// the index of the address connected to.
int ConnectToFirst(const std::vector<uint32_t>& addresses, uint16_t port, const SocketConnectOptions& options,
                   int* which, std::string* error);

}  // namespace hvdlite

// Each wire's settings, one struct per wire: EngineOptions (engine_options.h,
// which reads them from HVDLITE_* variables) holds one of each, and each
// wire is handed its own when a process set creates it (process_set.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvdlite {

// A setting that is on, off, or chosen from the layout of the ranks.
enum class Choice { kAuto, kOn, kOff };

// How the engine thread waits for a nonblocking MPI request (every wire's
// waits follow it). MPI moves data only while it is tested, so a waiting
// thread that sleeps stalls the transfer (a 1 MB allreduce took 5x longer
// with 100 us naps between tests); one that spins takes the core from the
// training thread. So it spins briefly (latency), then tests with a
// sched_yield in between, which runs any other thread that wants this core
// (backward, another rank) and comes straight back when none does; only a
// wait longer than yield_us (a peer that is far behind, or gone) drops to
// sleeping in sleep_us steps.
struct WaitPolicy {
  int64_t spin_us = 10;
  int64_t yield_us = 1000000;
  int64_t sleep_us = 100;
  // Give up waiting after this long (0 = never). Protects against a peer that
  // died without telling anyone.
  double timeout_seconds = 0.0;
  // Negotiation's waits on MPI in a process set whose members each have a
  // host to themselves yield for at most this long, then nap; after a wait
  // that outlasted it, the next one naps from the spin's end
  // (MpiTransport::WaitNegotiation). A round whose
  // peers are all there ends within it, so it keeps the round's latency,
  // which lies between one collective and the next; a rank whose peers are
  // behind (computing, checkpointing) would otherwise yield through every
  // round until they come, a whole core for as long as they take. No bytes
  // of a collective are in flight in a round, so a nap delays no transfer.
  int64_t negotiation_yield_us = 1000;

  // The policy of negotiation's waits: this one, yielding at most
  // negotiation_yield_us where `host_each` (one member per host, several hosts).
  WaitPolicy ForNegotiation(bool host_each) const {
    WaitPolicy p = *this;
    if (host_each && p.negotiation_yield_us < p.yield_us) p.yield_us = p.negotiation_yield_us;
    return p;
  }
};

// The shared-memory allreduce (transport/shm/shm_collectives.h).
struct ShmOptions {
  // Reduce through shared memory when every rank of a process set is on this
  // host; otherwise, or when off, MPI.
  bool allreduce = true;
  int64_t chunk_bytes = 128 * 1024;
  // Chunks in each rank's ring: how far a rank may run ahead of a peer that
  // is not scheduled (its core busy with backward) before it has to wait.
  int64_t slots = 16;
  // Whether it writes its slots with streaming (cache-bypassing) stores;
  // kAuto: measured while the job runs (transport/shm/slot_store_choice.h).
  // A rank's own choice: the bytes are the same either way.
  Choice streaming_stores = Choice::kAuto;
};

// What carries the ring's chunks: MPI point-to-point messages, or the
// ring's own TCP connections (transport/socket/socket_link.h), which the
// engine thread waits on asleep instead of polling MPI. The sockets by
// default: at 4 hosts x 1 rank, 1 Gbit/s, the same train step with the
// engine thread's CPU at 180 ms a step instead of 647, and the allreduce at
// 1.03x the wire floor against 1.06x (docs/engine.md).
enum class RingWire { kMpi, kSocket };

// Between hosts: large allreduces take a pipelined ring over MPI
// point-to-point (transport/ring/ring_transport.h).
struct RingOptions {
  Choice allreduce = Choice::kAuto;  // kAuto: when a process set spans more than one host
  RingWire wire = RingWire::kSocket;  // the flat ring's (one rank per host); hierarchical: MPI
  int64_t threshold_bytes = 1024 * 1024;
  int64_t chunk_bytes = 512 * 1024;
  int64_t window = 4;  // chunks in flight each way
  // The interfaces whose IPv4 addresses the sockets offer the neighbours, in
  // order of preference (HVDLITE_SOCKET_IFNAME, as Gloo's GLOO_SOCKET_IFNAME;
  // hvdrun --network-interface sets it); empty: every interface that is up.
  std::vector<std::string> socket_interfaces;
};

// Several ranks per host, the same number on each host, around the ring.
struct HierarchicalOptions {
  // Reduce inside the host first, ring between hosts (Horovod's
  // HOROVOD_HIERARCHICAL_ALLREDUCE). kAuto and kOn: whenever the ring runs on
  // such a layout; it beat MPI there (4 hosts x 2 ranks: 1411 against 1630 ms,
  // docs/scaling.md).
  Choice allreduce = Choice::kAuto;
  // Large allgathers gather across hosts by local rank, then inside the host
  // (transport/ring/hierarchical_allgather.h; Horovod's
  // HOROVOD_HIERARCHICAL_ALLGATHER). kAuto and kOn: wherever the allreduce
  // is hierarchical.
  Choice allgather = Choice::kAuto;
  // The in-host phases and the ring pipeline over pieces of this size
  // (transport/ring/hierarchical_allreduce.h).
  int64_t piece_bytes = 4 * 1024 * 1024;
};

}  // namespace hvdlite

// Responses the ranks already agreed on, by slot. Every rank applies the same
// sequence of inserts, touches and erasures, so slot numbers and evictions are
// identical everywhere and a bit vector of "ready" slots is enough to agree
// on a cached tensor without the coordinator.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "negotiation/message.h"

namespace hvdlite {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity) : capacity_(capacity < 0 ? 0 : capacity) {}

  bool enabled() const { return capacity_ > 0; }
  // The slot holding `q.name` if this rank's request is exactly the cached
  // one; -1 otherwise (not cached, or its metadata changed).
  int Lookup(const Request& q) const;
  int SlotOf(const std::string& name) const;
  const Response& response(int slot) const { return slots_[slot].response; }
  // Slots in use are < num_slots(); the bit vector covers that many.
  int num_slots() const { return static_cast<int>(slots_.size()); }
  bool used(int slot) const { return slots_[slot].used; }

  void Touch(int slot, uint64_t tick) { slots_[slot].last_used = tick; }
  // Caches `response` with this rank's request; evicts the least recently
  // used slot when full (its name goes to *evicted). Returns the slot.
  int Put(const Response& response, const Request& mine, uint64_t tick, std::string* evicted);
  void Erase(const std::string& name);

 private:
  struct Slot {
    bool used = false;
    Response response;
    Request request;
    uint64_t last_used = 0;
  };
  int64_t capacity_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> by_name_;
};

// True when two requests would produce the same response.
bool SameMetadata(const Request& a, const Request& b);

}  // namespace hvdlite

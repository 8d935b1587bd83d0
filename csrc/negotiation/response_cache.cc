#include "negotiation/response_cache.h"

namespace hvdlite {

bool SameMetadata(const Request& a, const Request& b) {
  return a.op == b.op && a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale &&
         a.root_rank == b.root_rank && a.compression == b.compression && a.splits == b.splits &&
         a.set_ranks == b.set_ranks && a.members_only == b.members_only &&
         a.target_set == b.target_set && a.device == b.device;
}

int ResponseCache::Lookup(const Request& q) const {
  int slot = SlotOf(q.name);
  if (slot < 0 || !SameMetadata(slots_[slot].request, q)) return -1;
  return slot;
}

int ResponseCache::SlotOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

int ResponseCache::Put(const Response& response, const Request& mine, uint64_t tick,
                       std::string* evicted) {
  evicted->clear();
  if (!enabled()) return -1;
  const std::string& name = response.name();
  int slot = SlotOf(name);
  if (slot < 0) {
    // Lowest free slot keeps the bit vector short; else evict the least
    // recently used (ties: lowest slot), identically on every rank.
    for (int s = 0; s < num_slots(); ++s) {
      if (!slots_[s].used) {
        slot = s;
        break;
      }
    }
    if (slot < 0 && num_slots() < capacity_) {
      slots_.emplace_back();
      slot = num_slots() - 1;
    }
    if (slot < 0) {
      slot = 0;
      for (int s = 1; s < num_slots(); ++s) {
        if (slots_[s].last_used < slots_[slot].last_used) slot = s;
      }
      *evicted = slots_[slot].response.name();
      by_name_.erase(*evicted);
    }
  }
  Slot& entry = slots_[slot];
  entry.used = true;
  entry.response = response;
  entry.request = mine;
  entry.last_used = tick;
  by_name_[name] = slot;
  return slot;
}

void ResponseCache::Erase(const std::string& name) {
  int slot = SlotOf(name);
  if (slot < 0) return;
  slots_[slot] = Slot();
  by_name_.erase(name);
  // Trim unused slots at the end so the bit vector stays short.
  while (!slots_.empty() && !slots_.back().used) slots_.pop_back();
}

}  // namespace hvdlite

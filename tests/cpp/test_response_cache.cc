// Checks of csrc/response_cache: lookups against every metadata field, slot
// reuse and trimming, least-recently-used eviction, and a long random
// sequence of puts, touches and erasures against a small model of the rules
// (every rank applies the same sequence, so slots must follow the rules
// exactly for ranks to agree through a bit vector). No MPI.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "negotiation/message.h"
#include "negotiation/response_cache.h"

#include "check.h"

using namespace hvdlite;
using hvdlite_test::RunTests;

namespace {

Request MakeRequest(const std::string& name) {
  Request q;
  q.name = name;
  q.op = OpType::kAllreduce;
  q.dtype = DataType::kFloat32;
  q.shape = {4, 2};
  q.reduce_op = ReduceOp::kSum;
  return q;
}

Response ResponseFor(const Request& q) {
  Response p;
  p.request = q;
  return p;
}

int Put(ResponseCache& cache, const Request& q, uint64_t tick, std::string* evicted) {
  return cache.Put(ResponseFor(q), q, tick, evicted);
}

void TestDisabled() {
  ResponseCache cache(0);
  CHECK(!cache.enabled(), "capacity 0 is disabled");
  std::string evicted = "x";
  CHECK(Put(cache, MakeRequest("a"), 1, &evicted) == -1, "put into a disabled cache");
  CHECK(evicted.empty(), "evicted '%s'", evicted.c_str());
  CHECK(cache.num_slots() == 0 && cache.Lookup(MakeRequest("a")) == -1, "nothing cached");
  CHECK(!ResponseCache(-5).enabled(), "negative capacity is disabled");
}

void TestLookupComparesEveryField() {
  ResponseCache cache(8);
  std::string evicted;
  Request q = MakeRequest("grad");
  q.splits = {1, 2};
  q.root_rank = 1;
  q.compression.type = CompressionType::kTopK;
  q.compression.topk_ratio = 0.25;
  const int slot = Put(cache, q, 1, &evicted);
  CHECK(slot == 0 && evicted.empty(), "slot %d", slot);
  CHECK(cache.Lookup(q) == 0, "the same request is found");
  CHECK(cache.SlotOf("grad") == 0 && cache.SlotOf("other") == -1, "SlotOf");
  CHECK(cache.response(0).name() == "grad", "the response is kept");
  // Each field, changed alone, is a different request.
  std::vector<std::pair<const char*, std::function<void(Request&)>>> changes = {
      {"op", [](Request& r) { r.op = OpType::kAllgather; }},
      {"dtype", [](Request& r) { r.dtype = DataType::kFloat64; }},
      {"shape", [](Request& r) { r.shape = {4, 3}; }},
      {"rank of shape", [](Request& r) { r.shape = {8}; }},
      {"reduce_op", [](Request& r) { r.reduce_op = ReduceOp::kMax; }},
      {"prescale", [](Request& r) { r.prescale = 0.5; }},
      {"postscale", [](Request& r) { r.postscale = 2.0; }},
      {"root_rank", [](Request& r) { r.root_rank = 0; }},
      {"splits", [](Request& r) { r.splits = {2, 1}; }},
      {"set ranks", [](Request& r) { r.set_ranks = {0, 1}; }},
      {"members only", [](Request& r) { r.members_only = true; }},
      {"target set", [](Request& r) { r.target_set = 2; }},
      {"compression type", [](Request& r) { r.compression.type = CompressionType::kFP16; }},
      {"top-k ratio", [](Request& r) { r.compression.topk_ratio = 0.5; }},
      {"error feedback", [](Request& r) { r.compression.error_feedback = true; }},
  };
  for (auto& change : changes) {
    Request other = q;
    change.second(other);
    CHECK(!SameMetadata(q, other), "SameMetadata ignores %s", change.first);
    CHECK(cache.Lookup(other) == -1, "a request with another %s hit the cache", change.first);
  }
  Request renamed = q;
  renamed.name = "grad2";
  CHECK(cache.Lookup(renamed) == -1, "another name hit the cache");
  Request other_rank = q;
  other_rank.rank = 3;  // who submitted it is not metadata
  CHECK(cache.Lookup(other_rank) == 0, "the submitting rank changed the lookup");
}

void TestSlotsReusedAndTrimmed() {
  ResponseCache cache(4);
  std::string evicted;
  for (int i = 0; i < 3; ++i) {
    const int slot = Put(cache, MakeRequest("t" + std::to_string(i)), i + 1, &evicted);
    CHECK(slot == i, "t%d in slot %d", i, slot);
  }
  cache.Erase("t1");
  CHECK(cache.num_slots() == 3 && !cache.used(1), "a slot in the middle stays, unused");
  CHECK(Put(cache, MakeRequest("t3"), 4, &evicted) == 1, "the lowest free slot is reused");
  cache.Erase("t2");
  CHECK(cache.num_slots() == 2, "the unused last slot is trimmed (%d slots)", cache.num_slots());
  cache.Erase("t0");
  cache.Erase("t3");
  CHECK(cache.num_slots() == 0, "all trimmed (%d slots)", cache.num_slots());
  cache.Erase("never");  // unknown names are ignored
  CHECK(cache.num_slots() == 0, "erasing an unknown name");
}

void TestLeastRecentlyUsedEvicted() {
  ResponseCache cache(2);
  std::string evicted;
  Put(cache, MakeRequest("a"), 1, &evicted);
  Put(cache, MakeRequest("b"), 2, &evicted);
  cache.Touch(cache.SlotOf("a"), 3);
  int slot = Put(cache, MakeRequest("c"), 4, &evicted);
  CHECK(evicted == "b" && slot == 1, "evicted '%s' into slot %d, want b / 1", evicted.c_str(), slot);
  CHECK(cache.SlotOf("b") == -1 && cache.SlotOf("c") == 1 && cache.SlotOf("a") == 0, "names moved");
  // Updating a cached name keeps its slot and evicts nothing.
  Request a2 = MakeRequest("a");
  a2.shape = {9};
  slot = Put(cache, a2, 5, &evicted);
  CHECK(slot == 0 && evicted.empty(), "update of a: slot %d, evicted '%s'", slot, evicted.c_str());
  CHECK(cache.Lookup(a2) == 0 && cache.Lookup(MakeRequest("a")) == -1, "the update replaced the request");
  // Equal ticks: the lowest slot goes.
  ResponseCache tied(2);
  Put(tied, MakeRequest("x"), 7, &evicted);
  Put(tied, MakeRequest("y"), 7, &evicted);
  slot = Put(tied, MakeRequest("z"), 8, &evicted);
  CHECK(evicted == "x" && slot == 0, "tie: evicted '%s' from slot %d", evicted.c_str(), slot);
}

// The rules, written out plainly: slots hold (name, last used); a new name
// takes the lowest free slot, else a new slot below capacity, else the least
// recently used one (lowest on ties); erasing frees a slot and trims unused
// slots at the end.
struct ModelCache {
  struct Slot {
    bool used = false;
    std::string name;
    uint64_t last = 0;
  };
  size_t capacity;
  std::vector<Slot> slots;

  int Find(const std::string& name) const {
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].used && slots[s].name == name) return static_cast<int>(s);
    }
    return -1;
  }
  int Put(const std::string& name, uint64_t tick, std::string* evicted) {
    evicted->clear();
    int slot = Find(name);
    if (slot < 0) {
      for (size_t s = 0; s < slots.size() && slot < 0; ++s) {
        if (!slots[s].used) slot = static_cast<int>(s);
      }
    }
    if (slot < 0 && slots.size() < capacity) {
      slots.emplace_back();
      slot = static_cast<int>(slots.size()) - 1;
    }
    if (slot < 0) {
      slot = 0;
      for (size_t s = 1; s < slots.size(); ++s) {
        if (slots[s].last < slots[slot].last) slot = static_cast<int>(s);
      }
      *evicted = slots[slot].name;
    }
    slots[slot] = Slot{true, name, tick};
    return slot;
  }
  void Erase(const std::string& name) {
    const int slot = Find(name);
    if (slot < 0) return;
    slots[slot] = Slot();
    while (!slots.empty() && !slots.back().used) slots.pop_back();
  }
};

void TestRandomSequenceFollowsTheRules() {
  for (int capacity : {1, 3, 8}) {
    std::mt19937_64 rng(1234 + capacity);
    ResponseCache cache(capacity);
    ModelCache model{static_cast<size_t>(capacity), {}};
    uint64_t tick = 0;
    int mismatches = 0;
    for (int step = 0; step < 20000 && mismatches < 5; ++step) {
      const std::string name = "n" + std::to_string(rng() % (2 * capacity + 3));
      const int action = static_cast<int>(rng() % 10);
      if (rng() % 3 != 0) ++tick;  // equal ticks too: ties go to the lowest slot
      if (action < 6) {
        std::string evicted, want_evicted;
        const int slot = Put(cache, MakeRequest(name), tick, &evicted);
        const int want = model.Put(name, tick, &want_evicted);
        if (slot != want || evicted != want_evicted) {
          ++mismatches;
          CHECK(false, "capacity %d step %d: put %s -> slot %d evicted '%s', want %d '%s'", capacity,
                step, name.c_str(), slot, evicted.c_str(), want, want_evicted.c_str());
        }
      } else if (action < 8) {
        const int slot = cache.SlotOf(name);
        const int want = model.Find(name);
        if (slot != want) {
          ++mismatches;
          CHECK(false, "capacity %d step %d: SlotOf(%s) = %d, want %d", capacity, step, name.c_str(),
                slot, want);
        }
        if (slot >= 0) {
          cache.Touch(slot, tick);
          model.slots[want].last = tick;
        }
      } else {
        cache.Erase(name);
        model.Erase(name);
      }
      if (cache.num_slots() != static_cast<int>(model.slots.size())) {
        ++mismatches;
        CHECK(false, "capacity %d step %d: %d slots, want %zu", capacity, step, cache.num_slots(),
              model.slots.size());
      }
    }
    CHECK(mismatches == 0, "capacity %d: %d mismatches", capacity, mismatches);
  }
}

}  // namespace

int main() {
  return RunTests({
      {"disabled cache", TestDisabled},
      {"lookup compares every metadata field", TestLookupComparesEveryField},
      {"lowest free slot reused, unused tail trimmed", TestSlotsReusedAndTrimmed},
      {"least recently used evicted, ties to the lowest slot", TestLeastRecentlyUsedEvicted},
      {"random puts/touches/erasures follow the rules", TestRandomSequenceFollowsTheRules},
  });
}

// join(): which ranks of a set are out of data, as its coordinator sees it.
// While any rank has joined, a tensor the others submit is ready without it
// (it takes part with zeros), the response cache is emptied (cached responses
// assume every rank submits), and once every rank has joined, one join
// response releases them all and the state starts over.
#pragma once

#include <cstdint>
#include <vector>

namespace hvdlite {

class JoinState {
 public:
  // Rank `rank` of a set of `size` ranks asked to join; idempotent.
  void Join(int rank, int size) {
    if (joined_.size() != static_cast<size_t>(size)) joined_.assign(static_cast<size_t>(size), false);
    if (joined_[static_cast<size_t>(rank)]) return;
    joined_[static_cast<size_t>(rank)] = true;
    ++count_;
    last_ = rank;
  }
  bool any() const { return count_ > 0; }
  bool all() const { return count_ > 0 && count_ == static_cast<int>(joined_.size()); }
  bool joined(int rank) const {
    return static_cast<size_t>(rank) < joined_.size() && joined_[static_cast<size_t>(rank)];
  }
  int32_t last() const { return last_; }  // the rank that joined last
  void Reset() {
    joined_.assign(joined_.size(), false);
    count_ = 0;
  }

 private:
  std::vector<bool> joined_;
  int count_ = 0;
  int32_t last_ = -1;
};

}  // namespace hvdlite

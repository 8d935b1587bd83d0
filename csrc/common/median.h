// The median of a sample of timings: robust to the few that a descheduled
// thread or a busy host stretches, which a mean is not.
#pragma once

#include <algorithm>
#include <vector>

namespace hvdlite {

// The middle value (the mean of the two middle ones for an even count); 0
// for an empty sample.
template <typename T>
T Median(std::vector<T> v) {
  if (v.empty()) return T(0);
  const size_t n = v.size();
  auto upper = v.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(v.begin(), upper, v.end());
  if (n % 2) return *upper;
  const T lower = *std::max_element(v.begin(), upper);
  return (lower + *upper) / T(2);
}

}  // namespace hvdlite

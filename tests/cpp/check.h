// Plain checks for the C++ test programs in this directory: CHECK(cond, fmt,
// ...) counts and prints a failed check and goes on; RunTests runs named test
// functions, prints "ok"/"FAIL" per test and "<n> checks, <m> failed", and
// returns the exit status. tests/harness/cpp_build.py builds and runs the programs.
#pragma once

#include <cstdio>
#include <initializer_list>

namespace hvdlite_test {

inline int g_checks = 0;
inline int g_failures = 0;

struct TestCase {
  const char* name;
  void (*fn)();
};

inline int RunTests(std::initializer_list<TestCase> tests) {
  for (const auto& t : tests) {
    const int before = g_failures;
    t.fn();
    std::printf("%s %s\n", g_failures == before ? "ok  " : "FAIL", t.name);
  }
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace hvdlite_test

#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    ++hvdlite_test::g_checks;                                                         \
    if (!(cond)) {                                                                    \
      if (++hvdlite_test::g_failures <= 40) {                                         \
        std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
        std::fprintf(stderr, __VA_ARGS__);                                            \
        std::fprintf(stderr, "\n");                                                   \
      }                                                                               \
    }                                                                                 \
  } while (0)

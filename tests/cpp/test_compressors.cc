// Checks of csrc/compressors: half conversions against an independent
// reference, vectorised == scalar, the MPI sum op, top-k exactness against a
// full sort, DecompressAdd, the quantizer's wire layout and rounding, and
// that error feedback loses nothing.
// (The element-wise reductions themselves: test_reduce_kernels.cc.)
// A plain program: prints each failed check, exits non-zero if any failed.
// Built and run by tests/test_compressors_cpp.py (tests/harness/cpp_build.py).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressors/bf16.h"
#include "compressors/compressor.h"
#include "compressors/density_warmup.h"
#include "compressors/error_feedback.h"
#include "compressors/fp16.h"
#include "compressors/momentum_correction.h"
#include "compressors/norm_clip.h"
#include "compressors/quantize.h"
#include "transport/mpi/mpi_transport.h"
#include "compressors/registry.h"
#include "compressors/topk.h"
#include "kernels/half.h"

#include "check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

using namespace hvdlite;
using hvdlite_test::RunTests;

namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
bool SameBytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }
bool HalfIsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// ---- an independent half reference: exact values in double ----------------

double HalfValue(uint16_t h) {  // non-NaN
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Nearest half by binary search over the positive finite halves; ties to even.
uint16_t RefFloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // 65520 is the tie between 65504 and 2^16
  int lo = 0, hi = 0x7bff;                 // largest h with value <= a
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (HalfValue(static_cast<uint16_t>(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  const double below = HalfValue(static_cast<uint16_t>(lo));
  const double above = lo == 0x7bff ? 65536.0 : HalfValue(static_cast<uint16_t>(lo + 1));
  int h;
  if (a - below < above - a) h = lo;
  else if (a - below > above - a) h = lo + 1;
  else h = (lo & 1) ? lo + 1 : lo;
  return static_cast<uint16_t>(sign | h);
}

std::vector<const Fp16Kernels*> AllKernels() {
  std::vector<const Fp16Kernels*> k = {&ScalarFp16Kernels()};
  if (F16CFp16Kernels()) k.push_back(F16CFp16Kernels());
  return k;
}

// ---- fp16 -------------------------------------------------------------------

void TestHalfAllPatterns() {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (const Fp16Kernels* k : AllKernels()) {
    std::vector<float> f(65536);
    k->to_float(all.data(), f.data(), 65536);
    std::vector<uint16_t> back(65536);
    k->to_half(f.data(), back.data(), 65536);
    for (int i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      if (HalfIsNan(h)) {
        CHECK(std::isnan(f[i]), "[%s] half %04x -> %g", k->name, i, f[i]);
        CHECK(HalfIsNan(back[i]) && (back[i] & 0x8000) == (h & 0x8000), "[%s] nan %04x -> %04x",
              k->name, i, back[i]);
      } else {
        const float want = static_cast<float>(HalfValue(h));
        CHECK(Bits(f[i]) == Bits(want), "[%s] half %04x -> %08x want %08x", k->name, i, Bits(f[i]),
              Bits(want));
        CHECK(back[i] == h, "[%s] round trip %04x -> %04x", k->name, i, back[i]);
      }
    }
  }
}

void TestFloatToHalfEdges() {
  std::vector<float> v = {
      0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, -65504.0f,
      65519.99f,                          // just below the overflow tie: 65504
      65520.0f, -65520.0f,                // the tie: to even, which is inf
      65536.0f, 1e10f, 3.4e38f,
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::ldexp(1.0f, -24),              // smallest subnormal half
      std::ldexp(1.0f, -25),              // half of it: tie to 0 (even)
      std::nextafter(std::ldexp(1.0f, -25), 1.0f),  // just above the tie: rounds up
      std::ldexp(3.0f, -25),              // tie between 1 and 2 units: 2 (even)
      std::ldexp(5.0f, -25),              // tie between 2 and 3 units: 2 (even)
      std::ldexp(1023.0f, -24),           // largest subnormal
      std::ldexp(1023.5f, -24),           // tie between largest subnormal and smallest normal
      std::ldexp(1.0f, -14),              // smallest normal
      std::ldexp(1.0f, -26), std::ldexp(1.0f, -30), 1e-40f, -1e-45f,  // to (signed) zero
      1.0f + std::ldexp(1.0f, -11),       // tie: to 1 (even)
      1.0f + 3 * std::ldexp(1.0f, -11),   // tie: up to the even neighbour
      std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f),
      2049.0f, 2051.0f, -2049.0f, 0.1f, -0.3f, 3.14159265f, 1000.7f, 32768.0f + 16.0f,
  };
  for (const Fp16Kernels* k : AllKernels()) {
    std::vector<uint16_t> h(v.size());
    k->to_half(v.data(), h.data(), static_cast<int64_t>(v.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      CHECK(h[i] == RefFloatToHalf(v[i]), "[%s] %a -> %04x want %04x", k->name, v[i], h[i],
            RefFloatToHalf(v[i]));
    }
    const float nans[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          FromBits(0x7f800001u), FromBits(0xffc12345u)};
    uint16_t hn[4];
    k->to_half(nans, hn, 4);
    for (int i = 0; i < 4; ++i) {
      CHECK(HalfIsNan(hn[i]) && (hn[i] >> 15) == (Bits(nans[i]) >> 31), "[%s] nan %08x -> %04x",
            k->name, Bits(nans[i]), hn[i]);
    }
  }
  // Random floats around the half range, against the reference.
  std::mt19937_64 rng(7);
  std::vector<float> r(200000);
  for (float& x : r) {
    uint32_t b = static_cast<uint32_t>(rng());
    const uint32_t exp = 127 - 28 + static_cast<uint32_t>(rng() % 46);  // 2^-28 .. 2^17
    b = (b & 0x807fffffu) | (exp << 23);
    x = FromBits(b);
  }
  for (const Fp16Kernels* k : AllKernels()) {
    std::vector<uint16_t> h(r.size());
    k->to_half(r.data(), h.data(), static_cast<int64_t>(r.size()));
    int bad = 0;
    for (size_t i = 0; i < r.size(); ++i) bad += h[i] != RefFloatToHalf(r[i]);
    CHECK(bad == 0, "[%s] %d random floats differ from the reference", k->name, bad);
  }
}

std::vector<float> RandomFloats(size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const int kind = static_cast<int>(rng() % 16);
    if (kind < 10) v[i] = normal(rng);
    else if (kind < 13) v[i] = normal(rng) * 3e4f;
    else if (kind < 15) v[i] = normal(rng) * 1e-6f;
    else v[i] = specials ? (rng() % 2 ? 1e9f : -std::numeric_limits<float>::infinity()) : 0.5f;
  }
  return v;
}

// The F16C kernels must equal the scalar ones bitwise (NaN aside), for every
// length (tails) and for unaligned pointers.
void TestVectorisedEqualsScalar() {
  const Fp16Kernels* v = F16CFp16Kernels();
  if (!v) {
    std::printf("  (no F16C on this CPU: vectorised == scalar not checked)\n");
    return;
  }
  const Fp16Kernels& s = ScalarFp16Kernels();
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  lengths.push_back(1000003);
  for (int64_t n : lengths) {
    for (int shift = 0; shift < 2; ++shift) {
      const size_t total = static_cast<size_t>(n + shift);
      std::vector<float> f = RandomFloats(total, 100 + n, true);
      std::vector<float> g = RandomFloats(total, 200 + n, true);
      const float* fin = f.data() + shift;
      std::vector<uint16_t> hs(total), hv(total), hs2(total), hv2(total);
      s.to_half(fin, hs.data() + shift, n);
      v->to_half(fin, hv.data() + shift, n);
      CHECK(hs == hv, "to_half n=%lld shift=%d", static_cast<long long>(n), shift);
      s.to_half(g.data() + shift, hs2.data() + shift, n);
      hv2 = hs2;
      std::vector<float> fs(total, 7.0f), fv(total, 7.0f);
      s.to_float(hs.data() + shift, fs.data() + shift, n);
      v->to_float(hs.data() + shift, fv.data() + shift, n);
      CHECK(SameBytes(fs.data(), fv.data(), total * 4), "to_float n=%lld", static_cast<long long>(n));
      std::vector<float> as(g), av(g);
      s.add_to_float(hs.data() + shift, as.data() + shift, n);
      v->add_to_float(hs.data() + shift, av.data() + shift, n);
      CHECK(SameBytes(as.data(), av.data(), total * 4), "add_to_float n=%lld",
            static_cast<long long>(n));
      std::vector<uint16_t> ss(hs2);
      s.sum(hs.data() + shift, ss.data() + shift, n);
      v->sum(hs.data() + shift, hv2.data() + shift, n);
      CHECK(ss == hv2, "sum n=%lld", static_cast<long long>(n));
    }
  }
}

// A framework may set flush-to-zero / denormals-are-zero or another rounding
// mode on the thread; the wire must not change (F16C's immediate rounding mode
// and its exact subnormal handling ignore MXCSR).
void TestIndependentOfMxcsr() {
#if defined(__x86_64__) || defined(__i386__)
  const Fp16Kernels* v = F16CFp16Kernels();
  if (!v) return;
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  ScalarFp16Kernels().to_float(all.data(), f.data(), 65536);
  std::vector<float> mid(f);  // halfway and off-grid values exercise rounding
  for (int i = 0; i + 1 < 65536; ++i) mid[i] = f[i] * 1.0004f;
  std::vector<uint16_t> want(65536), want_mid(65536);
  v->to_half(f.data(), want.data(), 65536);
  v->to_half(mid.data(), want_mid.data(), 65536);
  const unsigned saved = _mm_getcsr();
  for (unsigned bits : {0x8040u /* FTZ|DAZ */, 0x6000u /* toward zero */, 0x2000u /* down */}) {
    _mm_setcsr((saved & ~0xe040u) | bits);
    std::vector<float> g(65536);
    std::vector<uint16_t> h(65536), hm(65536);
    v->to_float(all.data(), g.data(), 65536);
    v->to_half(f.data(), h.data(), 65536);
    v->to_half(mid.data(), hm.data(), 65536);
    _mm_setcsr(saved);
    int bad = 0;
    for (int i = 0; i < 65536; ++i) {
      if (HalfIsNan(static_cast<uint16_t>(i))) continue;
      bad += Bits(g[i]) != Bits(f[i]);
      bad += h[i] != want[i];
      bad += !std::isnan(mid[i]) && hm[i] != want_mid[i];
    }
    CHECK(bad == 0, "MXCSR %04x changed %d conversions", bits, bad);
  }
#endif
}

void TestMpiSumOp() {
  FP16Compressor c;
  CHECK(c.wire_dtype() == DataType::kFloat16, "wire type");
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL, again = MPI_OP_NULL;
  CHECK(MpiReduction(c.wire_dtype(), ReduceOp::kSum, &type, &op), "MPI reduction of the wire");
  CHECK(type == MPI_UINT16_T && op != MPI_OP_NULL, "op created");
  CHECK(MpiReduction(c.wire_dtype(), ReduceOp::kSum, &type, &again) && again == op, "op created once");
  for (int64_t n : {0, 1, 13, 64, 1000003}) {
    std::vector<float> a = RandomFloats(static_cast<size_t>(n), 300 + n, false);
    std::vector<float> b = RandomFloats(static_cast<size_t>(n), 400 + n, false);
    std::vector<uint16_t> ha(n), hb(n);
    ScalarFp16Kernels().to_half(a.data(), ha.data(), n);
    ScalarFp16Kernels().to_half(b.data(), hb.data(), n);
    std::vector<uint16_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = FloatToHalf(HalfToFloat(ha[i]) + HalfToFloat(hb[i]));
    std::vector<uint16_t> got(hb);
    MPI_Reduce_local(ha.data(), got.data(), static_cast<int>(n), type, op);
    CHECK(got == want, "MPI_Reduce_local fp16 sum n=%lld", static_cast<long long>(n));
    // Also through a contiguous type of halves (counts elements via its size).
    if (n % 4 == 0 && n > 0) {
      MPI_Datatype four;
      MPI_Type_contiguous(4, MPI_UINT16_T, &four);
      MPI_Type_commit(&four);
      std::vector<uint16_t> got4(hb);
      MPI_Reduce_local(ha.data(), got4.data(), static_cast<int>(n / 4), four, op);
      CHECK(got4 == want, "contiguous-type sum n=%lld", static_cast<long long>(n));
      MPI_Type_free(&four);
    }
  }
  // Sums that leave the half range overflow to inf rather than wrapping.
  uint16_t x = FloatToHalf(60000.0f), y = FloatToHalf(60000.0f);
  MPI_Reduce_local(&x, &y, 1, MPI_UINT16_T, op);
  CHECK(y == 0x7c00, "overflow -> inf, got %04x", y);
}

void TestFp16Compressor() {
  const int64_t total = 3000;
  std::vector<float> buf = RandomFloats(total, 11, false);
  std::vector<Segment> segs = {{"a", 5, 100}, {"b", 200, 0}, {"c", 300, 1001}, {"d", 1400, 1599}};
  FP16Compressor c;
  CHECK(c.Describe() == "fp16", "describe");
  CHECK(c.wire() == Compressor::Wire::kAllreduce, "wire kind");
  const size_t bytes = c.CompressedBytes(segs);
  CHECK(bytes == 2 * (100 + 1001 + 1599), "bytes %zu", bytes);
  std::vector<uint8_t> wire(bytes + 16, 0xAB);
  CHECK(c.Compress(buf.data(), segs, wire.data()) == bytes, "returned bytes");
  CHECK(wire[bytes] == 0xAB, "no write past the wire form");
  std::vector<float> out(total, -5.0f);
  c.Decompress(wire.data(), segs, out.data());
  std::vector<float> add(total, 1.0f);
  c.DecompressAdd(wire.data(), segs, add.data());
  int bad = 0;
  for (int64_t i = 0; i < total; ++i) {
    bool inside = false;
    for (const Segment& s : segs) inside |= i >= s.offset && i < s.offset + s.count;
    const float want = inside ? HalfToFloat(FloatToHalf(buf[i])) : -5.0f;
    bad += Bits(out[i]) != Bits(want);
    bad += Bits(add[i]) != Bits(inside ? 1.0f + want : 1.0f);
  }
  CHECK(bad == 0, "%d fp16 decompress mismatches", bad);
}

// ---- top-k ------------------------------------------------------------------

// The reference: the k largest by (magnitude bits, lower index first), by a
// full sort; returns the indices ascending.
std::vector<uint32_t> RefTopK(const float* x, int64_t n, int64_t k) {
  std::vector<uint32_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return (Bits(x[a]) & 0x7fffffffu) > (Bits(x[b]) & 0x7fffffffu);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

enum class Data { kNormal, kTies, kZeros, kAscending, kDescending, kSpecials, kSparse };
const char* DataName(Data d) {
  switch (d) {
    case Data::kNormal: return "normal";
    case Data::kTies: return "ties";
    case Data::kZeros: return "zeros";
    case Data::kAscending: return "ascending";
    case Data::kDescending: return "descending";
    case Data::kSpecials: return "specials";
    case Data::kSparse: return "sparse";
  }
  return "?";
}

void Fill(float* x, int64_t n, Data d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    switch (d) {
      case Data::kNormal: x[i] = normal(rng); break;
      case Data::kTies: x[i] = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;
      case Data::kZeros: x[i] = (rng() % 2) ? 0.0f : -0.0f; break;
      case Data::kAscending: x[i] = static_cast<float>(i) * ((i % 2) ? -1.0f : 1.0f); break;
      case Data::kDescending: x[i] = static_cast<float>(n - i); break;
      case Data::kSpecials: {
        const int r = static_cast<int>(rng() % 1000);
        x[i] = r == 0 ? std::numeric_limits<float>::quiet_NaN()
             : r == 1 ? -std::numeric_limits<float>::infinity()
             : r == 2 ? std::numeric_limits<float>::infinity() : normal(rng);
        break;
      }
      case Data::kSparse: x[i] = (rng() % 200 == 0) ? normal(rng) : 0.0f; break;
    }
  }
}

// Checks one segment's wire form against the reference.
bool CheckTopKWire(const float* x, int64_t n, int64_t k, const uint8_t* wire, const char* what) {
  std::vector<uint32_t> want = RefTopK(x, n, k);
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  if (k > 0) {
    std::memcpy(idx.data(), wire, 4 * k);
    std::memcpy(val.data(), wire + 4 * k, 4 * k);
  }
  bool ok = idx == want;
  for (int64_t t = 0; ok && t < k; ++t) ok = Bits(val[t]) == Bits(x[idx[t]]);
  CHECK(ok, "top-k of %s n=%lld k=%lld differs from the sort reference", what,
        static_cast<long long>(n), static_cast<long long>(k));
  return ok;
}

void TestTopKExact() {
  CHECK(TopKCompressor::K(0.01, 0) == 0, "k of empty");
  CHECK(TopKCompressor::K(0.01, 1) == 1, "k at least 1");
  CHECK(TopKCompressor::K(1e-12, 1000000) == 1, "k at least 1");
  CHECK(TopKCompressor::K(0.01, 1000) == 10, "k = ratio n");
  CHECK(TopKCompressor::K(0.01, 1001) == 11, "k rounds up");
  CHECK(TopKCompressor::K(1.0, 12345) == 12345, "ratio 1");
  // Same double expression as Python's math.ceil(0.07 * 100) == 8.
  CHECK(TopKCompressor::K(0.07, 100) == 8, "k = ceil(ratio * n) in double");

  const Data kinds[] = {Data::kNormal, Data::kTies, Data::kZeros, Data::kAscending,
                        Data::kDescending, Data::kSpecials, Data::kSparse};
  const int64_t sizes[] = {1, 2, 7, 100, 1000, 40000, 200003};
  const double ratios[] = {1e-9, 0.001, 0.01, 0.1, 0.5, 1.0};
  // Small samples and a negative margin make the estimate miss both ways.
  struct { int64_t sample; double sd, extra; bool vectorised; } configs[] = {
      {TopKCompressor::kDefaultSampleSize, 3.0, 2.0, true}, {64, 3.0, 2.0, true},
      {8, 3.0, 2.0, true}, {64, -2.0, 0.0, true}, {8, -1.0, 0.0, false}};
  int64_t repeated = 0, compactions = 0, cases = 0;
  for (const auto& cfg : configs) {
    const int64_t sample = cfg.sample;
    for (double ratio : ratios) {
      TopKCompressor c(ratio, sample);
      c.set_threshold_margin(cfg.sd, cfg.extra);
      c.set_vectorised(cfg.vectorised);
      for (int64_t n : sizes) {
        for (Data d : kinds) {
          if (n > 100000 && (ratio == 1e-9 || ratio == 0.5) && sample > 8) continue;  // time
          std::vector<float> x(n);
          Fill(x.data(), n, d, static_cast<uint64_t>(n) * 31 + static_cast<uint64_t>(d));
          std::vector<Segment> segs = {{"t", 0, n}};
          const int64_t k = c.K(n);
          std::vector<uint8_t> wire(c.CompressedBytes(segs));
          CHECK(wire.size() == static_cast<size_t>(8 * k), "wire bytes");
          const size_t written = c.Compress(x.data(), segs, wire.data());
          CHECK(written == wire.size(), "returned bytes");
          char what[96];
          std::snprintf(what, sizeof(what), "%s (ratio %g, sample %lld, %s)", DataName(d), ratio,
                        static_cast<long long>(sample), cfg.vectorised ? "simd" : "scalar");
          CheckTopKWire(x.data(), n, k, wire.data(), what);
          ++cases;
        }
      }
      repeated += c.repeated_passes();
      compactions += c.compactions();
    }
  }
  std::printf("  top-k: %lld cases, %lld repeated passes, %lld mid-pass trims\n",
              static_cast<long long>(cases), static_cast<long long>(repeated),
              static_cast<long long>(compactions));
  CHECK(repeated > 0, "the too-few-candidates fallback was exercised");
  CHECK(compactions > 0, "the too-many-candidates trim was exercised");
}

// Several segments of one buffer (with gaps), compressed in one call.
void TestTopKSegments() {
  const std::vector<Segment> segs = {{"a", 3, 1},      {"b", 10, 5},     {"c", 20, 1000},
                                     {"d", 1100, 0},   {"e", 1100, 50000}, {"f", 60000, 333333}};
  const int64_t total = 400000;
  std::vector<float> x(total);
  Fill(x.data(), total, Data::kNormal, 5);
  Fill(x.data() + 20, 1000, Data::kTies, 6);
  for (double ratio : {0.01, 0.3}) {
    TopKCompressor c(ratio);
    std::vector<uint8_t> wire(c.CompressedBytes(segs));
    CHECK(c.Compress(x.data(), segs, wire.data()) == wire.size(), "returned bytes");
    size_t pos = 0;
    for (const Segment& s : segs) {
      const int64_t k = c.K(s.count);
      CheckTopKWire(x.data() + s.offset, s.count, k, wire.data() + pos, s.name.c_str());
      pos += 8 * k;
    }
    CHECK(pos == wire.size(), "layout");
  }
}

// Three "ranks" allgather their wire forms; every rank sums them.
void TestTopKDecompressAdd() {
  const std::vector<Segment> segs = {{"a", 0, 777}, {"b", 800, 5000}, {"c", 6000, 30000}};
  const int64_t total = 40000;
  const float kSentinel = 42.0f;
  TopKCompressor c(0.05);
  const size_t bytes = c.CompressedBytes(segs);
  std::vector<std::vector<uint8_t>> wires;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < 3; ++r) {
    std::vector<float> x(total);
    Fill(x.data(), total, r == 1 ? Data::kTies : Data::kNormal, 50 + r);
    std::vector<uint8_t> w(bytes);
    CHECK(c.Compress(x.data(), segs, w.data()) == bytes, "bytes");
    wires.push_back(w);
    inputs.push_back(x);
  }
  // Reference: dense sum of each rank's top-k, added in rank order.
  std::vector<float> want(total, kSentinel);
  for (const Segment& s : segs) std::fill(want.begin() + s.offset, want.begin() + s.offset + s.count, 0.0f);
  for (int r = 0; r < 3; ++r) {
    for (const Segment& s : segs) {
      for (uint32_t i : RefTopK(inputs[r].data() + s.offset, s.count, c.K(s.count))) {
        want[s.offset + i] += inputs[r][s.offset + i];
      }
    }
  }
  std::vector<float> got(total, kSentinel);
  for (const Segment& s : segs) std::fill(got.begin() + s.offset, got.begin() + s.offset + s.count, 0.0f);
  for (int r = 0; r < 3; ++r) c.DecompressAdd(wires[r].data(), segs, got.data());
  CHECK(std::memcmp(got.data(), want.data(), total * 4) == 0, "DecompressAdd sum");
  std::vector<float> got2(total, kSentinel);  // Decompress of rank 0 then add the others
  c.Decompress(wires[0].data(), segs, got2.data());
  for (int r = 1; r < 3; ++r) c.DecompressAdd(wires[r].data(), segs, got2.data());
  CHECK(std::memcmp(got2.data(), want.data(), total * 4) == 0, "Decompress + DecompressAdd");
}

// ---- error feedback ---------------------------------------------------------

// Over many steps: sum of what was sent + the final residual == sum of inputs.
// Integer-valued inputs keep every float operation exact, so this is equality.
void TestErrorFeedbackConserves(std::unique_ptr<Compressor> inner, bool integers, double tol) {
  const std::string what = inner->Describe();
  ErrorFeedback ef(std::move(inner));
  CHECK(ef.Describe() == what + "+ef", "describe %s", ef.Describe().c_str());
  const std::vector<Segment> segs = {{"w", 0, 1000}, {"b", 1024, 37}, {"v", 2000, 6000}};
  const int64_t total = 8000;
  std::vector<double> sum_in(total, 0.0), sum_out(total, 0.0);
  std::vector<uint8_t> wire(ef.CompressedBytes(segs));
  std::vector<float> x(total), dec(total);
  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < 60; ++step) {
    for (float& v : x) v = integers ? static_cast<float>(static_cast<int>(rng() % 17) - 8) : normal(rng);
    for (int64_t i = 0; i < total; ++i) sum_in[i] += x[i];
    CHECK(ef.Compress(x.data(), segs, wire.data()) == wire.size(), "bytes");
    std::fill(dec.begin(), dec.end(), 0.0f);
    ef.Decompress(wire.data(), segs, dec.data());
    for (int64_t i = 0; i < total; ++i) sum_out[i] += dec[i];
  }
  double worst = 0.0;
  for (const Segment& s : segs) {
    std::vector<float> r;
    CHECK(ef.GetResidual(s.name, &r) && static_cast<int64_t>(r.size()) == s.count, "residual %s",
          s.name.c_str());
    for (int64_t i = 0; i < s.count; ++i) {
      const double diff = std::fabs(sum_out[s.offset + i] + r[i] - sum_in[s.offset + i]);
      worst = std::max(worst, diff);
    }
  }
  CHECK(worst <= tol, "%s: sent + residual differs from the inputs by %g", ef.Describe().c_str(), worst);

  // A segment whose count changes starts from a zero residual.
  const std::vector<Segment> shrunk = {{"w", 0, 500}};
  std::vector<uint8_t> w2(ef.CompressedBytes(shrunk));
  ef.Compress(x.data(), shrunk, w2.data());
  std::fill(dec.begin(), dec.end(), 0.0f);
  ef.Decompress(w2.data(), shrunk, dec.data());
  std::vector<float> r;
  CHECK(ef.GetResidual("w", &r) && r.size() == 500, "resized residual");
  bool fresh = true;
  for (int64_t i = 0; i < 500; ++i) fresh &= r[i] == x[i] - dec[i];  // zero signs may differ
  CHECK(fresh, "residual after a count change = input - sent");
  CHECK(ef.residual_count() == 3, "residuals kept per name");
  ef.Reset();
  CHECK(ef.residual_count() == 0 && !ef.GetResidual("w", &r), "Reset clears");
}

void TestRegistry() {
  CompressionSpec none;
  CHECK(CreateCompressor(none) == nullptr, "none -> nullptr");
  CompressionSpec fp16;
  fp16.type = CompressionType::kFP16;
  auto f = CreateCompressor(fp16);
  CHECK(f && f->Describe() == "fp16" && f->wire() == Compressor::Wire::kAllreduce, "fp16");
  CHECK(f && f->wire_dtype() == DataType::kFloat16, "fp16 wire type");
  CompressionSpec topk;
  topk.type = CompressionType::kTopK;
  topk.topk_ratio = 0.01;
  auto t = CreateCompressor(topk);
  CHECK(t && t->Describe() == "topk(0.01)" && t->wire() == Compressor::Wire::kAllgather, "topk");
  topk.error_feedback = true;
  auto te = CreateCompressor(topk);
  CHECK(te && te->Describe() == "topk(0.01)+ef" && te->wire() == Compressor::Wire::kAllgather, "topk+ef");
  CHECK(dynamic_cast<ErrorFeedback*>(te.get()) != nullptr, "ef decorator");
  topk.topk_ratio = 1.0;
  CHECK(CreateCompressor(topk) != nullptr, "ratio 1 ok");
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    topk.topk_ratio = bad;
    CHECK(CreateCompressor(topk) == nullptr, "ratio %g -> nullptr", bad);
  }
  CompressionSpec weird;
  weird.type = static_cast<CompressionType>(99);
  CHECK(CreateCompressor(weird) == nullptr, "unknown type -> nullptr");
  CHECK(!IsValidCompression(99) && !CheckCompression(weird, OpType::kAllreduce, DataType::kFloat32, 1).empty(), "unknown code");
  CHECK(CompressionCode("fp16") == 1 && CompressionCode("topk") == 2 && CompressionCode("none") == 0,
        "codes by name");
  CHECK(CompressionCode("zstd") == -1, "unknown name");
  topk.topk_ratio = 0.25;
  CHECK(topk.ToString() == "topk(ratio=0.25, error_feedback=True)", "%s", topk.ToString().c_str());
  CHECK(CheckCompression(topk, OpType::kAllreduce, DataType::kFloat64, 10).find("float32") != std::string::npos, "topk dtype");
  CHECK(CheckCompression(topk, OpType::kAllreduce, DataType::kFloat32, 10).empty(), "topk ok");
}

// A compressor that this program alone defines: the one registration line
// below is all the engine needs to build it, check its arguments, name it and
// count its wire bytes.
class HalvingCompressor : public FP16Compressor {
 public:
  std::string Describe() const override { return "test_halving"; }
};

std::string RefuseFloat64(const CompressionSpec&, DataType dtype, int64_t) {
  return dtype == DataType::kFloat64 ? "test_halving needs float32" : "";
}

const bool kHalvingRegistered = RegisterCompressor(
    {static_cast<CompressionType>(9), "test_halving",
     [](const CompressionSpec&) -> std::unique_ptr<Compressor> { return std::make_unique<HalvingCompressor>(); },
     RefuseFloat64});

void TestRegisteredElsewhere() {
  CHECK(kHalvingRegistered && IsValidCompression(9) && CompressionCode("test_halving") == 9, "registered");
  CompressionSpec spec;
  spec.type = static_cast<CompressionType>(9);
  auto c = CreateCompressor(spec);
  CHECK(c && c->Describe() == "test_halving", "built through the registry");
  CHECK(spec.ToString() == "test_halving", "%s", spec.ToString().c_str());
  CHECK(CheckCompression(spec, OpType::kAllreduce, DataType::kFloat64, 4) == "test_halving needs float32", "its own check");
  EngineStats stats;
  stats.Add(WireBytes(&stats, spec.type), 12);
  CHECK(stats.wire_bytes[9].load() == 12 && stats.wire_bytes[1].load() == 0, "its own wire counter");
  CompressorCache cache;
  CHECK(cache.For(spec) == cache.For(spec) && cache.For(spec) != nullptr, "cached per spec");
}

// Warm-up: the density schedule, and every call of one round agreeing on it.
void TestDensityWarmup() {
  DensityWarmup w(std::make_unique<TopKCompressor>(0.01), 4);
  CHECK(w.RatioAt(0) == 1.0 && w.RatioAt(4) == 0.01 && w.RatioAt(9) == 0.01, "schedule ends");
  CHECK(std::fabs(w.RatioAt(2) - 0.1) < 1e-12, "halfway: %g", w.RatioAt(2));
  const int64_t n = 5000;
  std::vector<float> x(n);
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = normal(gen);
  std::vector<Segment> segs{{"a", 0, 3000, 0}, {"b", 3000, 2000, 0}};
  for (int round = 0; round < 6; ++round) {
    w.BeginRound(segs);
    const size_t bytes = w.CompressedBytes(segs);
    const int64_t ka = TopKCompressor::K(w.RatioAt(round), 3000), kb = TopKCompressor::K(w.RatioAt(round), 2000);
    CHECK(bytes == static_cast<size_t>(8 * (ka + kb)), "round %d: %zu bytes", round, bytes);
    CHECK(w.Sparsifies(segs[0]) == (ka < 3000), "round %d: sparsifies", round);
    std::vector<uint8_t> wire(bytes);
    CHECK(w.Compress(x.data(), segs, wire.data()) == bytes, "round %d: compress size", round);
    std::vector<float> out(n, 0.0f);
    w.DecompressAdd(wire.data(), segs, out.data());
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (out[i] != 0.0f) {
        ++kept;
        CHECK(out[i] == x[i], "round %d: value %lld", round, static_cast<long long>(i));
      }
    }
    CHECK(kept == ka + kb, "round %d: %lld kept", round, static_cast<long long>(kept));
  }
}

// Momentum correction: velocity u = m u + g goes to error feedback; where
// top-k sparsifies, a sent entry's velocity is cleared; where everything is
// sent, the velocity carries on (ordinary momentum).
void TestMomentumCorrection() {
  const float m = 0.5f;
  MomentumCorrection mc(std::make_unique<ErrorFeedback>(std::make_unique<TopKCompressor>(0.001, 16384, 1024)), m);
  std::vector<float> g(4096, 1.0f);
  g[10] = 100.0f;  // k = 5 of 4096: entry 10 and the first four ties (0-3: lower indices first)
  std::vector<Segment> big{{"w", 0, 4096, 64}};
  std::vector<uint8_t> wire(mc.CompressedBytes(big));
  mc.Compress(g.data(), big, wire.data());
  std::vector<float> u;
  CHECK(mc.GetVelocity("w", &u), "velocity kept");
  CHECK(u[10] == 0.0f && u[0] == 0.0f && u[3] == 0.0f, "sent entries masked");
  CHECK(u[4] == 1.0f, "the next tie was not sent: %g", u[4]);
  CHECK(u[100] == 1.0f, "unsent entry keeps its velocity: %g", u[100]);
  mc.Compress(g.data(), big, wire.data());
  mc.GetVelocity("w", &u);
  CHECK(u[100] == 1.5f, "u = m u + g: %g", u[100]);
  CHECK(u[10] == 0.0f, "entry 10 leads again, is sent and masked: %g", u[10]);

  std::vector<float> b(100);
  for (int i = 0; i < 100; ++i) b[i] = static_cast<float>(i);
  std::vector<Segment> small{{"b", 0, 100, 0}};  // below 1024: sent whole
  std::vector<uint8_t> w2(mc.CompressedBytes(small));
  std::vector<float> out(100);
  mc.Compress(b.data(), small, w2.data());
  mc.Compress(b.data(), small, w2.data());
  mc.Decompress(w2.data(), small, out.data());
  CHECK(out[7] == 7.0f * (1 + m), "dense: ordinary momentum, got %g", out[7]);
}

void TestNormClip() {
  NormClip clip(std::make_unique<TopKCompressor>(1.0), 5.0);
  std::vector<float> x{3.0f, 4.0f, 0.0f, 30.0f, 40.0f, 0.0f};  // norms 5 (kept) and 50 (scaled to 5)
  std::vector<Segment> segs{{"a", 0, 3, 0}, {"b", 3, 3, 0}};
  std::vector<uint8_t> wire(clip.CompressedBytes(segs));
  CHECK(clip.Compress(x.data(), segs, wire.data()) == wire.size(), "size");
  std::vector<float> out(6, 0.0f);
  clip.Decompress(wire.data(), segs, out.data());
  CHECK(out[0] == 3.0f && out[1] == 4.0f, "under the limit: unchanged");
  CHECK(std::fabs(out[3] - 3.0f) < 1e-6 && std::fabs(out[4] - 4.0f) < 1e-6, "clipped: %g %g", out[3], out[4]);
  CHECK(x[3] == 30.0f, "input untouched");
}

void TestBF16Compressor() {
  BF16Compressor c;
  std::vector<float> x{1.0f, 1.00390625f, 1.01171875f, 3e38f, -2.5f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<Segment> segs{{"a", 0, 6, 0}};
  std::vector<uint8_t> wire(c.CompressedBytes(segs));
  CHECK(wire.size() == 12 && c.Compress(x.data(), segs, wire.data()) == 12, "2 bytes each");
  std::vector<float> out(6);
  c.Decompress(wire.data(), segs, out.data());
  CHECK(out[0] == 1.0f && out[1] == 1.0f && out[2] == 1.015625f, "ties to even: %g %g", out[1], out[2]);
  CHECK(std::isfinite(out[3]) && std::fabs(out[3] / 3e38f - 1) < 0.01, "float32's range: %g", out[3]);
  CHECK(out[4] == -2.5f && std::isnan(out[5]), "exact and NaN");
}


// ---- block quantizer ----------------------------------------------------------

// Hand-computed codes: a = 7 gives scale 1, so codes are the rounded values;
// -3.5 is a tie (to even: -4); layout is scales, then two codes per byte
// stored as q + 8, the low nibble first.
void TestQuantizeLayout() {
  QuantizeCompressor c(4, 4, QuantizeCompressor::Rounding::kNearest, 0);
  CHECK(c.Describe() == "quantize(4, 4, nearest)", "%s", c.Describe().c_str());
  const std::vector<float> x{7.0f, -3.5f, 1.0f, 0.0f, 2.5f};  // blocks [7 -3.5 1 0] and [2.5]
  const std::vector<Segment> segs{{"a", 0, 5, 0}};
  std::vector<uint8_t> wire(c.CompressedBytes(segs), 0xee);
  CHECK(wire.size() == 2 * 4 + 3, "2 scales + 3 bytes of codes: %zu", wire.size());
  CHECK(c.Compress(x.data(), segs, wire.data()) == wire.size(), "bytes written");
  float s0, s1;
  std::memcpy(&s0, wire.data(), 4);
  std::memcpy(&s1, wire.data() + 4, 4);
  CHECK(s0 == 1.0f && s1 == 2.5f / 7.0f, "scales %g %g", s0, s1);
  CHECK(wire[8] == 0x4f && wire[9] == 0x89 && wire[10] == 0x0f, "codes %02x %02x %02x", wire[8], wire[9], wire[10]);
  std::vector<float> out(5, 99.0f);
  c.Decompress(wire.data(), segs, out.data());
  CHECK(out[0] == 7.0f && out[1] == -4.0f && out[2] == 1.0f && out[3] == 0.0f, "decoded %g %g %g %g", out[0],
        out[1], out[2], out[3]);
  CHECK(out[4] == 7.0f * (2.5f / 7.0f), "a block's largest value: %g", out[4]);
  c.DecompressAdd(wire.data(), segs, out.data());
  CHECK(out[0] == 14.0f && out[1] == -8.0f, "DecompressAdd adds");
}

// NaN and inf take code 0 and decode as NaN; the block's finite values keep
// their own scale; an all-zero block sends scale 0.
void TestQuantizeNonFinite() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int bits : {4, 8}) {
    QuantizeCompressor c(bits, 4, QuantizeCompressor::Rounding::kNearest, 0);
    const std::vector<float> x{nan, 1.0f, -inf, -0.5f, 0.0f, -0.0f, inf, 0.0f};
    const std::vector<Segment> segs{{"a", 0, 8, 0}};
    std::vector<uint8_t> wire(c.CompressedBytes(segs));
    c.Compress(x.data(), segs, wire.data());
    std::vector<float> out(8);
    c.Decompress(wire.data(), segs, out.data());
    CHECK(std::isnan(out[0]) && std::isnan(out[2]) && std::isnan(out[6]), "%d bits: non-finite -> NaN", bits);
    CHECK(out[1] == 1.0f && std::fabs(out[3] + 0.5f) <= 1.0f / 14 + 1e-6f, "%d bits: finite scale: %g %g", bits, out[1],
          out[3]);
    CHECK(out[4] == 0.0f && out[5] == 0.0f && out[7] == 0.0f, "%d bits: zero block", bits);
  }
}

// Segments in one buffer: the concatenation of each segment's own form.
void TestQuantizeSegments() {
  QuantizeCompressor c(4, 64, QuantizeCompressor::Rounding::kStochastic, 5);
  QuantizeCompressor alone(4, 64, QuantizeCompressor::Rounding::kStochastic, 5);
  std::vector<float> x(400);
  Fill(x.data(), 400, Data::kNormal, 3);
  const std::vector<Segment> segs{{"a", 0, 131, 0}, {"b", 200, 7, 0}, {"c", 250, 150, 0}};
  std::vector<uint8_t> wire(c.CompressedBytes(segs));
  CHECK(c.Compress(x.data(), segs, wire.data()) == wire.size(), "bytes");
  size_t pos = 0;
  for (const Segment& s : segs) {
    std::vector<uint8_t> own(alone.SegmentBytes(s.count));
    alone.Compress(x.data(), {s}, own.data());
    CHECK(SameBytes(own.data(), wire.data() + pos, own.size()), "segment %s alone", s.name.c_str());
    pos += own.size();
  }
  CHECK(pos == wire.size(), "layout covers the form");
}

// Stochastic rounding is unbiased: the mean of many roundings of one value
// (each a new step: new draws) approaches it; to nearest it does not move.
void TestQuantizeStochasticUnbiased() {
  QuantizeCompressor c(4, 2, QuantizeCompressor::Rounding::kStochastic, 11);
  const std::vector<float> x{1.0f, 0.3f};  // 0.3 is 2.1 steps of 1/7
  const std::vector<Segment> segs{{"u", 0, 2, 0}};
  std::vector<uint8_t> wire(c.CompressedBytes(segs));
  double sum = 0.0;
  const int trials = 20000;
  for (int t = 0; t < trials; ++t) {
    c.Compress(x.data(), segs, wire.data());
    std::vector<float> out(2);
    c.Decompress(wire.data(), segs, out.data());
    const float step = 1.0f / 7.0f;  // the block's scale: decoded values are q * step
    CHECK(out[1] == 2.0f * step || out[1] == 3.0f * step, "one of the two neighbours: %g", out[1]);
    sum += out[1];
  }
  CHECK(std::fabs(sum / trials - 0.3) < 0.003, "mean %g of 0.3", sum / trials);
  c.Reset();
  QuantizeCompressor again(4, 2, QuantizeCompressor::Rounding::kStochastic, 11);
  std::vector<uint8_t> w1(wire.size()), w2(wire.size());
  c.Compress(x.data(), segs, w1.data());
  again.Compress(x.data(), segs, w2.data());
  CHECK(SameBytes(w1.data(), w2.data(), w1.size()), "Reset starts the draws over");
}

void TestQuantizeRegistry() {
  CompressionSpec spec;
  spec.type = CompressionType::kQuantize;
  spec.bits = 4;
  spec.block_size = 64;
  spec.error_feedback = true;
  CHECK(CompressionCode("quantize") == 5, "code");
  auto c = CreateCompressor(spec);
  CHECK(c && c->Describe() == "quantize(4, 64, nearest)+ef" && c->wire() == Compressor::Wire::kAllgather,
        "quantize+ef");
  CHECK(spec.ToString() == "quantize(bits=4, block_size=64, rounding='nearest', error_feedback=True, seed=0)",
        "%s", spec.ToString().c_str());
  CHECK(FindCompressorKind(spec.type)->takes_16bit_floats, "takes 16-bit floats");
  CHECK(CheckCompression(spec, OpType::kReducescatter, DataType::kFloat16, 10).empty(), "float16 reducescatter");
  spec.bits = 3;
  CHECK(CheckCompression(spec, OpType::kAllreduce, DataType::kFloat32, 10).find("4 or 8") != std::string::npos &&
            CreateCompressor(spec) == nullptr, "bits");
  spec.bits = 8;
  spec.block_size = 1;
  CHECK(CheckCompression(spec, OpType::kAllreduce, DataType::kFloat32, 10).find("block_size") != std::string::npos,
        "block size");
  spec.block_size = 64;
  CHECK(CheckCompression(spec, OpType::kAllreduce, DataType::kFloat32, int64_t{2100000000}).find("2^31-1") !=
            std::string::npos, "too many bytes for one allgather at 8 bits");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::printf("fp16 kernels: %s\n", BestFp16Kernels().name);
  const int status = RunTests({
      {"half: all 65536 patterns", TestHalfAllPatterns},
      {"half: float edges + random vs reference", TestFloatToHalfEdges},
      {"half: vectorised == scalar", TestVectorisedEqualsScalar},
      {"half: independent of MXCSR (FTZ/DAZ, rounding)", TestIndependentOfMxcsr},
      {"fp16: MPI sum op (MPI_Reduce_local)", TestMpiSumOp},
      {"fp16: compressor segments", TestFp16Compressor},
      {"top-k: exact vs sort", TestTopKExact},
      {"top-k: segments in one buffer", TestTopKSegments},
      {"top-k: DecompressAdd", TestTopKDecompressAdd},
      {"error feedback: top-k, integers (exact)",
       [] { TestErrorFeedbackConserves(std::make_unique<TopKCompressor>(0.01), true, 0.0); }},
      {"error feedback: top-k, normal",
       [] { TestErrorFeedbackConserves(std::make_unique<TopKCompressor>(0.05, 64), false, 1e-4); }},
      {"error feedback: fp16, normal",
       [] { TestErrorFeedbackConserves(std::make_unique<FP16Compressor>(), false, 1e-4); }},
      {"bf16: compressor", TestBF16Compressor},
      {"quantize: layout and rounding", TestQuantizeLayout},
      {"quantize: NaN, inf and zero blocks", TestQuantizeNonFinite},
      {"quantize: segments in one buffer", TestQuantizeSegments},
      {"quantize: stochastic rounding is unbiased and seeded", TestQuantizeStochasticUnbiased},
      {"quantize: registry", TestQuantizeRegistry},
      {"error feedback: quantize 4 bits, normal",
       [] { TestErrorFeedbackConserves(std::make_unique<QuantizeCompressor>(4, 64, QuantizeCompressor::Rounding::kNearest, 0), false, 1e-4); }},
      {"top-k: density warm-up", TestDensityWarmup},
      {"top-k: momentum correction and masking", TestMomentumCorrection},
      {"norm clip", TestNormClip},
      {"registry", TestRegistry},
      {"registry: a compressor registered by one line", TestRegisteredElsewhere},
  });
  MPI_Finalize();
  return status;
}

#include "common/json_text.h"

#include <charconv>

namespace hvdlite {

namespace {

// Length of the valid UTF-8 sequence at `s`, 0 if it is not one. Names come
// from users; one stray byte would make the whole file unreadable as JSON.
size_t Utf8SequenceLength(const unsigned char* s, size_t n) {
  unsigned char c = s[0];
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  }
  return len;
}

}  // namespace

void AppendInt(std::string* out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, res.ptr);
}

void AppendQuoted(std::string* out, const char* s, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  const auto* u = reinterpret_cast<const unsigned char*>(s);
  out->push_back('"');
  size_t i = 0;
  while (i < n) {
    unsigned char c = u[i];
    if (c >= 0x80) {
      size_t len = Utf8SequenceLength(u + i, n - i);
      if (len == 0) {
        out->append("\\ufffd");
        ++i;
      } else {
        out->append(s + i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xF]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out->push_back('"');
}

std::string JsonQuote(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  AppendQuoted(&out, s.data(), s.size());
  return out;
}

}  // namespace hvdlite

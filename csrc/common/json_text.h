// Writing JSON text by hand, for the timeline's events: integers without
// locale or allocation, and strings quoted so that no user-given name (any
// bytes) can break the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdlite {

void AppendInt(std::string* out, int64_t v);
// `s[0, n)` as a quoted JSON string; invalid UTF-8 becomes U+FFFD.
void AppendQuoted(std::string* out, const char* s, size_t n);
// `s` as a quoted JSON string, e.g. for building "\"tensor\":" + JsonQuote(name).
std::string JsonQuote(const std::string& s);

}  // namespace hvdlite

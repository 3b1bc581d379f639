// UTF-8 for the C++ tests and the fuzz harnesses: they build texts from code points.
#pragma once

#include <string>

namespace ctxcore_testing {

// UTF-8 of one code point; surrogates are written as three bytes (as Python's
// "surrogatepass" does).
inline std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// UTF-8 of a string of code points, each as `utf8(char32_t)` writes it.
inline std::string utf8(const std::u32string& s) {
  std::string out;
  for (const char32_t c : s) out += utf8(c);
  return out;
}

}  // namespace ctxcore_testing

// Protocol Buffers wire encoding of trace rows; see ctxcore/wire.hpp.
#include "ctxcore/wire.hpp"

#include <cstring>
#include <string_view>

namespace ctxcore::wire {
namespace {

enum WireType : std::uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2 };

constexpr std::uint32_t tag(std::uint32_t field, WireType type) { return (field << 3) | type; }

std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

std::uint64_t bits_of(double d) {
  std::uint64_t b = 0;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

void append_fixed64(std::string& out, std::uint64_t v) {
  char buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xFF);  // little-endian
  out.append(buf, 8);
}

// An enum or int32 is written as the 64-bit two's complement of its value (negative: 10 bytes).
std::uint64_t as_varint(std::int64_t v) { return static_cast<std::uint64_t>(v); }

// proto3 leaves a field at its default out: an empty string, a zero number, all-zero bits.
std::size_t string_size(std::string_view v) { return v.empty() ? 0 : 1 + varint_size(v.size()) + v.size(); }
std::size_t varint_field_size(std::int64_t v) { return v == 0 ? 0 : 1 + varint_size(as_varint(v)); }
std::size_t double_size(double v) { return bits_of(v) == 0 ? 0 : 1 + 8; }

void append_string(std::string& out, std::uint32_t field, std::string_view v) {
  if (v.empty()) return;
  append_varint(out, tag(field, kLengthDelimited));
  append_varint(out, v.size());
  out.append(v);
}

void append_varint_field(std::string& out, std::uint32_t field, std::int64_t v) {
  if (v == 0) return;
  append_varint(out, tag(field, kVarint));
  append_varint(out, as_varint(v));
}

void append_double(std::string& out, std::uint32_t field, double v) {
  if (bits_of(v) == 0) return;
  append_varint(out, tag(field, kFixed64));
  append_fixed64(out, bits_of(v));
}

}  // namespace

void append_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

std::size_t trace_entry_size(const TraceEntry& e) {
  return string_size(e.memory_id) + varint_field_size(e.reason) + string_size(e.origin) + varint_field_size(e.tokens) +
         double_size(e.score) + double_size(e.relevance) + varint_field_size(e.recounted ? 1 : 0) +
         string_size(e.signal);
}

void append_trace_entry(std::string& out, std::uint32_t field, const TraceEntry& e) {
  append_varint(out, tag(field, kLengthDelimited));
  append_varint(out, trace_entry_size(e));
  append_string(out, 1, e.memory_id);
  append_varint_field(out, 2, e.reason);
  append_string(out, 3, e.origin);
  append_varint_field(out, 4, e.tokens);
  append_double(out, 5, e.score);
  append_double(out, 6, e.relevance);
  append_varint_field(out, 7, e.recounted ? 1 : 0);
  append_string(out, 8, e.signal);
}

}  // namespace ctxcore::wire

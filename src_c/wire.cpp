// Protocol Buffers wire encoding of trace rows; see ctxcore/wire.hpp.
#include "ctxcore/wire.hpp"

#include <cstring>

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

}  // namespace

void append_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

std::size_t trace_entry_size(const TraceEntry& e) {
  std::size_t n = 0;
  if (!e.memory_id.empty()) n += 1 + varint_size(e.memory_id.size()) + e.memory_id.size();
  if (e.reason != 0) n += 1 + varint_size(as_varint(e.reason));
  if (!e.origin.empty()) n += 1 + varint_size(e.origin.size()) + e.origin.size();
  if (e.tokens != 0) n += 1 + varint_size(as_varint(e.tokens));
  if (bits_of(e.score) != 0) n += 1 + 8;
  if (bits_of(e.relevance) != 0) n += 1 + 8;
  if (e.recounted) n += 1 + 1;
  return n;
}

void append_trace_entry(std::string& out, std::uint32_t field, const TraceEntry& e) {
  append_varint(out, tag(field, kLengthDelimited));
  append_varint(out, trace_entry_size(e));
  if (!e.memory_id.empty()) {
    append_varint(out, tag(1, kLengthDelimited));
    append_varint(out, e.memory_id.size());
    out.append(e.memory_id);
  }
  if (e.reason != 0) {
    append_varint(out, tag(2, kVarint));
    append_varint(out, as_varint(e.reason));
  }
  if (!e.origin.empty()) {
    append_varint(out, tag(3, kLengthDelimited));
    append_varint(out, e.origin.size());
    out.append(e.origin);
  }
  if (e.tokens != 0) {
    append_varint(out, tag(4, kVarint));
    append_varint(out, as_varint(e.tokens));
  }
  if (bits_of(e.score) != 0) {
    append_varint(out, tag(5, kFixed64));
    append_fixed64(out, bits_of(e.score));
  }
  if (bits_of(e.relevance) != 0) {
    append_varint(out, tag(6, kFixed64));
    append_fixed64(out, bits_of(e.relevance));
  }
  if (e.recounted) {
    append_varint(out, tag(7, kVarint));
    out.push_back(1);
  }
}

}  // namespace ctxcore::wire

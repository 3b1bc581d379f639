// Protocol Buffers wire encoding of the trace: the one part of an answer with a row per
// memory candidate. The service writes each answer's trace rows here, straight from the
// pipeline's columns, and merges the bytes into the response message (a serialized
// repeated field appended to a message is the same as adding its entries), instead of
// setting seven fields per row from Python. Plain C++17, no Python, no protobuf library.
//
// The layout is `ctxcore.v1.TraceEntry` (ctxcore/v1/context_assembly.proto), proto3:
//   1 memory_id string, 2 reason enum, 3 origin string, 4 tokens int64, 5 score double,
//   6 relevance double, 7 recounted bool
// with fields in number order and fields at their default value left out, as protobuf's
// own serializers write them (a double is left out only when all its bits are zero, so
// -0.0 is written).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ctxcore::wire {

// One trace row, its strings borrowed.
struct TraceEntry {
  std::string_view memory_id;
  std::int32_t reason = 0;
  std::string_view origin;
  std::int64_t tokens = 0;
  double score = 0.0;
  double relevance = 0.0;
  bool recounted = false;
  std::string_view signal;  // the dominant signal of a fused value; empty when none
};

// Appends `value` as a base-128 varint.
void append_varint(std::string& out, std::uint64_t value);

// The encoded size of `e` as a message (without a tag or length in front).
std::size_t trace_entry_size(const TraceEntry& e);

// Appends `e` as field `field` (length-delimited) of the enclosing message: the tag, the
// length, then the entry's fields.
void append_trace_entry(std::string& out, std::uint32_t field, const TraceEntry& e);

}  // namespace ctxcore::wire

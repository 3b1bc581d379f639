// Unit tests of the trace's wire encoding, run through ctest (also under ASan + UBSan in
// CI). The expected bytes are written out by hand from the protobuf encoding rules.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "ctxcore/wire.hpp"

namespace {

using ctxcore::wire::TraceEntry;

std::string encoded(const TraceEntry& e, std::uint32_t field = 8) {
  std::string out;
  ctxcore::wire::append_trace_entry(out, field, e);
  return out;
}

std::string varint(std::uint64_t v) {
  std::string out;
  ctxcore::wire::append_varint(out, v);
  return out;
}

TEST(Wire, VarintsAreBase128LittleEndian) {
  EXPECT_EQ(varint(0), std::string(1, '\0'));
  EXPECT_EQ(varint(1), "\x01");
  EXPECT_EQ(varint(127), "\x7f");
  EXPECT_EQ(varint(128), "\x80\x01");
  EXPECT_EQ(varint(300), "\xac\x02");
  EXPECT_EQ(varint(std::numeric_limits<std::uint64_t>::max()), "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
}

TEST(Wire, AnEmptyEntryIsItsTagAndAZeroLength) {
  EXPECT_EQ(encoded(TraceEntry{}), std::string("\x42\x00", 2));
  EXPECT_EQ(ctxcore::wire::trace_entry_size(TraceEntry{}), 0u);
}

TEST(Wire, FieldsComeInNumberOrderAndDefaultsAreLeftOut) {
  TraceEntry e;
  e.memory_id = "m1";
  e.reason = 3;
  e.origin = "hot";
  e.tokens = 300;
  e.score = 1.0;  // 0x3FF0000000000000, little-endian
  e.recounted = true;
  e.signal = "vector";
  const std::string want = std::string("\x42\x21", 2) + "\x0a\x02m1" + "\x10\x03" + "\x1a\x03hot" + "\x20\xac\x02" +
                           std::string("\x29\x00\x00\x00\x00\x00\x00\xf0\x3f", 9) + "\x38\x01" + "\x42\x06vector";
  EXPECT_EQ(encoded(e), want);
  EXPECT_EQ(ctxcore::wire::trace_entry_size(e), want.size() - 2);
}

TEST(Wire, NegativeZeroIsWrittenAndNegativeNumbersTakeTenBytes) {
  TraceEntry e;
  e.relevance = -0.0;
  e.tokens = -1;
  const std::string got = encoded(e);
  // tag+len, tokens tag + 10-byte varint, relevance tag + 8 bytes.
  EXPECT_EQ(got.size(), 2u + 11u + 9u);
  EXPECT_EQ(got.substr(2, 11), "\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
  EXPECT_EQ(got.substr(13), std::string("\x31\x00\x00\x00\x00\x00\x00\x00\x80", 9));
}

TEST(Wire, LongStringsAndLargeFieldNumbersHaveVarintLengthsAndTags) {
  TraceEntry e;
  const std::string id(200, 'x');
  e.memory_id = id;
  const std::string got = encoded(e, 1000);
  EXPECT_EQ(got.substr(0, 2), varint((1000u << 3) | 2));
  EXPECT_EQ(got.substr(2, 2), varint(203));  // 1 tag byte + 2 length bytes + 200
  EXPECT_EQ(got.substr(4, 3), "\x0a\xc8\x01");
  EXPECT_EQ(got.size(), 4u + 203u);
}

}  // namespace

// libFuzzer harness for the serializer. Built with -DCTXCORE_BUILD_FUZZERS=ON and clang;
// tools/run-tests runs it for a bounded time.
//
// The input bytes become a whole FormatInput (directive, messages, memories with optional
// score and source, tools JSON, a valid or invalid nonce) and, separately, one string for
// the bare escapers. Any crash, sanitizer report or broken invariant aborts. Invariants:
//   - the output is valid UTF-8 made only of XML 1.0 characters, and its reported length
//     and largest code point, and every offset's code-point position, are right;
//   - the pieces tile the text, each after the first starting with a newline, and the
//     sections come in their fixed order;
//   - every memory piece has exactly the expected shape, and decoding its attribute values
//     and body gives back the input as the sanitizer writes it (illegal characters
//     replaced), so no content can have closed, opened or forged anything;
//   - replaced_chars is the sum of the replacements in every string;
//   - text and attribute escapes contain no '<' or '>' (and attributes no quote), JSON
//     escapes no '<', '>' or '&'.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ctxcore/serializer.hpp"

namespace {

// Aborts (which libFuzzer reports with the input) naming the broken invariant.
#define check(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz_serializer.cpp:%d: invariant broken: %s\n", __LINE__, #cond); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

// Code points in s[0, bytes): the bytes that are not continuation bytes.
std::size_t code_points(std::string_view s, std::size_t bytes) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < bytes; ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0U) != 0x80U ? 1U : 0U;
  return n;
}

// Decodes UTF-8 that the serializer wrote; aborts on anything ill-formed or not an XML
// Char. Returns the largest code point.
char32_t check_xml_utf8(std::string_view s) {
  char32_t largest = 0;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    char32_t cp = 0;
    std::size_t n = 0;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      cp = c & 0x1FU;
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      cp = c & 0x0FU;
      n = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      cp = c & 0x07U;
      n = 4;
    } else {
      std::abort();
    }
    check(i + n <= s.size());
    for (std::size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      check((b & 0xC0U) == 0x80U);
      cp = (cp << 6) | (b & 0x3FU);
    }
    // Shortest form only.
    check(n == 1 || (n == 2 && cp >= 0x80) || (n == 3 && cp >= 0x800) || (n == 4 && cp >= 0x10000));
    const bool xml = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
                     (cp >= 0xE000 && cp <= 0xFFFD) || (cp >= 0x10000 && cp <= 0x10FFFF);
    check(xml);
    if (cp > largest) largest = cp;
    i += n;
  }
  return largest;
}

// The input as the serializer must give it back: illegal characters replaced.
std::string sanitized(std::string_view s, std::int64_t& replaced) {
  std::string out;
  ctxcore::append_sanitized(out, s, replaced);
  return out;
}

// Reverses the references the escapers write. Aborts on any other '&' sequence.
std::string unescape(std::string_view s) {
  static const std::pair<std::string_view, char> kRefs[] = {
      {"&amp;", '&'},  {"&lt;", '<'},  {"&gt;", '>'},   {"&quot;", '"'},
      {"&#39;", '\''}, {"&#9;", '\t'}, {"&#10;", '\n'}, {"&#13;", '\r'},
  };
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] != '&') {
      out.push_back(s[i++]);
      continue;
    }
    bool found = false;
    for (const auto& [ref, ch] : kRefs) {
      if (s.substr(i, ref.size()) == ref) {
        out.push_back(ch);
        i += ref.size();
        found = true;
        break;
      }
    }
    check(found);
  }
  return out;
}

// Reads `prefix` then an attribute value up to the closing quote (values hold no quote).
std::string_view take_attr(std::string_view& rest, std::string_view prefix) {
  check(rest.substr(0, prefix.size()) == prefix);
  rest.remove_prefix(prefix.size());
  const std::size_t q = rest.find('"');
  check(q != std::string_view::npos);
  std::string_view v = rest.substr(0, q);
  rest.remove_prefix(q + 1);
  return v;
}

void check_memory_piece(std::string_view piece, std::string_view nonce, const ctxcore::Memory& m,
                        std::int64_t& replaced, bool compact) {
  std::string_view rest = piece;
  if (compact) {
    // <m HANDLE="NONCE": the handle, a valid attribute name, written as given.
    check(ctxcore::is_compact_handle(m.id));
    check(take_attr(rest, "\n<m " + std::string(m.id) + "=\"") == nonce);
  } else {
    check(take_attr(rest, "\n<memory nonce=\"") == nonce);
    const std::string_view id = take_attr(rest, " id=\"");
    check(id.find_first_of("<>\t\n\r'") == std::string_view::npos);
    check(unescape(id) == sanitized(m.id, replaced));
  }
  if (m.has_score) {
    const std::string_view score = take_attr(rest, " score=\"");
    check(!score.empty() && score.find_first_not_of("0123456789.e+-") == std::string_view::npos);
  }
  if (m.has_source) {
    const std::string_view source = take_attr(rest, " source=\"");
    check(source.find_first_of("<>\t\n\r'") == std::string_view::npos);
    check(unescape(source) == sanitized(m.source, replaced));
  }
  if (m.has_created_at) {
    const std::string_view created = take_attr(rest, " created_at=\"");
    check(created.find_first_of("<>\t\n\r'") == std::string_view::npos);
    check(unescape(created) == sanitized(m.created_at, replaced));
  }
  check(!rest.empty() && rest[0] == '>');
  rest.remove_prefix(1);
  const std::string_view kClose = compact ? "</m>" : "</memory>";
  check(rest.size() >= kClose.size() && rest.substr(rest.size() - kClose.size()) == kClose);
  const std::string_view body = rest.substr(0, rest.size() - kClose.size());
  check(body.find_first_of("<>\r") == std::string_view::npos);
  check(unescape(body) == sanitized(m.text, replaced));
}

void fuzz_format(FuzzedDataProvider& fdp) {
  std::vector<std::string> strings;
  strings.reserve(64);
  const auto str = [&]() -> std::string_view {
    strings.push_back(fdp.ConsumeRandomLengthString(256));
    return strings.back();
  };
  ctxcore::FormatInput in;
  in.directive = fdp.ConsumeBool() ? str() : std::string_view();
  std::vector<ctxcore::Message> history(fdp.ConsumeIntegralInRange<std::size_t>(0, 4));
  for (auto& h : history) {
    h.role = str();
    h.content = str();
  }
  const bool compact = fdp.ConsumeBool();
  std::vector<ctxcore::Memory> memories(fdp.ConsumeIntegralInRange<std::size_t>(0, 8));
  std::vector<std::string> handles;
  handles.reserve(memories.size());
  for (auto& m : memories) {
    // The compact rendering takes handles (m1, m2, ...); now and then anything else.
    if (compact && fdp.ConsumeIntegralInRange(0, 7) != 0) {
      handles.push_back("m" + std::to_string(handles.size() + 1));
      m.id = handles.back();
    } else {
      m.id = str();
    }
    m.text = str();
    m.has_score = fdp.ConsumeBool();
    m.score = fdp.ConsumeFloatingPoint<double>();
    m.has_source = fdp.ConsumeBool();
    if (m.has_source) m.source = str();
    m.has_created_at = fdp.ConsumeBool();
    if (m.has_created_at) m.created_at = str();
  }
  in.history = {history.data(), history.size()};
  in.memories = {memories.data(), memories.size()};
  in.tools_json = fdp.ConsumeBool() ? str() : std::string_view();
  const int nonce_kind = fdp.ConsumeIntegralInRange(0, 2);
  const std::string nonce = nonce_kind == 0
                                ? std::string(compact ? "01234567890123456789" : "0123456789abcdef0123456789abcdef")
                            : nonce_kind == 1 ? std::string("417 harbor quietly mint loop")
                                              : fdp.ConsumeRandomLengthString(64);
  in.nonce = nonce;
  const ctxcore::FormatOptions opt{fdp.ConsumeBool(), true,
                                   compact ? ctxcore::MemoryFormat::Compact : ctxcore::MemoryFormat::Verbose};

  ctxcore::FormattedText r;
  try {
    r = ctxcore::format_context(in, opt);
  } catch (const ctxcore::InvalidFormatInput&) {
    // Only these inputs may be rejected.
    bool bad = compact ? !ctxcore::is_valid_compact_nonce(in.nonce) : !ctxcore::is_valid_nonce(in.nonce);
    for (const auto& h : history) bad = bad || h.role.empty();
    for (const auto& m : memories)
      bad = bad || m.id.empty() || (compact && !ctxcore::is_compact_handle(m.id)) ||
            (m.has_score && !(m.score - m.score == 0.0));
    check(bad);
    return;
  }
  const char32_t largest = check_xml_utf8(r.text);
  check(r.code_points == code_points(r.text, r.text.size()));
  check(r.max_code_point == (r.text.empty() ? 0 : (largest < 0x7F ? 0x7F : largest)));

  // Pieces tile the text; memory pieces decode back to their input.
  std::size_t begin = 0;
  std::size_t memory = 0;
  std::int64_t replaced = 0;
  std::int64_t replaced_elsewhere = 0;
  for (const auto& p : r.pieces) {
    check(p.end.byte > begin && p.end.byte <= r.text.size());
    check(p.end.code_point == code_points(r.text, p.end.byte));
    if (begin > 0) check(r.text[begin] == '\n');
    const std::string_view piece(r.text.data() + begin, p.end.byte - begin);
    if (p.kind == ctxcore::PieceKind::Memory) {
      check(memory < memories.size());
      check_memory_piece(piece, in.nonce, memories[memory++], replaced, compact);
    }
    begin = p.end.byte;
  }
  check(begin == r.text.size());
  check(memory == memories.size());

  // Every other string's replacements, counted by the sanitizer the same way.
  sanitized(in.directive, replaced_elsewhere);
  for (const auto& h : history) {
    sanitized(h.role, replaced_elsewhere);
    sanitized(h.content, replaced_elsewhere);
  }
  std::string json;
  std::int64_t json_replaced = 0;
  ctxcore::append_escaped_json(json, in.tools_json, json_replaced);
  check(r.replaced_chars == replaced + replaced_elsewhere + json_replaced);

  std::size_t last = 0;
  for (std::size_t i = 0; i < r.sections.size(); ++i) {
    check(r.sections[i].begin.byte < r.sections[i].end.byte && r.sections[i].end.byte <= r.text.size());
    check(r.sections[i].begin.code_point == code_points(r.text, r.sections[i].begin.byte));
    check(r.sections[i].end.code_point == code_points(r.text, r.sections[i].end.byte));
    if (i > 0) {
      check(r.sections[i].section > r.sections[i - 1].section);
      check(r.sections[i].begin.byte == last + 2);
    }
    last = r.sections[i].end.byte;
  }
}

void fuzz_escapers(std::string_view s) {
  std::int64_t replaced = 0;
  std::string text;
  ctxcore::append_escaped_text(text, s, replaced);
  check_xml_utf8(text);
  check(text.find_first_of("<>\r") == std::string::npos);
  std::string attr;
  ctxcore::append_escaped_attribute(attr, s, replaced);
  check_xml_utf8(attr);
  check(attr.find_first_of("<>\"'\t\n\r") == std::string::npos);
  std::string json;
  ctxcore::append_escaped_json(json, s, replaced);
  check_xml_utf8(json);
  check(json.find_first_of("<>\r") == std::string::npos);
  // The only reference JSON mode writes is CR's.
  for (std::size_t at = json.find('&'); at != std::string::npos; at = json.find('&', at + 1))
    check(json.compare(at, 5, "&#13;") == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_escapers({reinterpret_cast<const char*>(data), size});
  FuzzedDataProvider fdp(data, size);
  fuzz_format(fdp);
  return 0;
}

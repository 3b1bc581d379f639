// The serializer: turns the packed context (directive, recent messages, selected memories,
// tool schemas) into the text sent to the model, so that no memory can become markup or
// instructions. It is the last stage of the pipeline, after packing. Plain C++17, no Python.
//
// Memories are untrusted data. Their section is a well-formed XML fragment: a safety
// sentence, then one <memory> element per memory whose opening tag carries the caller's
// per-assembly nonce and the memory's id. Every byte of content goes through an escaper
// that writes markup characters as entities and replaces what XML 1.0 cannot carry (C0
// controls other than tab/LF/CR, surrogates, U+FFFE, U+FFFF, ill-formed UTF-8) with U+FFFD,
// counting each replacement. Content is copied or escaped, never parsed: nothing inside
// a memory can change how the serializer proceeds.
//
// The output is the concatenation of *pieces* (a section's frame, one directive, one
// message, one memory, the tools JSON), each piece after the first starting with a newline.
// The Python layer prices pieces one by one with the token estimator before packing, so
// the formatter's overhead is known before the packer runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ctxcore/packer.hpp"

namespace ctxcore {

// 128 random bits written as hex: the shortest nonce the serializer accepts.
inline constexpr std::size_t kMinNonceHexDigits = 32;
// The compact rendering's nonce, in one of two forms, both markup-free:
// - words: three decimal digits, then at least kMinCompactNonceWords words of 2 to
//   kMaxCompactNonceWordLetters lowercase ASCII letters, each after one space (the form the
//   Python layer generates: 10 + 4 x 14 random bits from a list of 2**14 words that are
//   single tokens after a space in cl100k_base and o200k_base: five tokens, the fewest of
//   the alphabets measured, docs/memory-wrapper-cost.md);
// - digits: at least kMinCompactNonceDigits decimal digits (66 bits).
inline constexpr std::size_t kMinCompactNonceDigits = 20;
inline constexpr std::size_t kMinCompactNonceWords = 4;
inline constexpr std::size_t kMaxCompactNonceWordLetters = 12;
// The compact rendering names each element by a handle, "m" and a decimal number without
// leading zeros (m1, m2, ...), written as the attribute that holds the nonce: at most
// this many characters.
inline constexpr std::size_t kMaxCompactHandleChars = 20;
// The longest replacement of one input byte: "&quot;" or a JSON "\u0026".
inline constexpr std::size_t kMaxGrowth = 6;

// The sections, in the fixed order they appear in the output. Values are stable: the
// Python layer mirrors them.
enum class FormatSection : std::uint8_t { Directive = 0, History = 1, Memories = 2, Tools = 3 };
inline constexpr std::size_t kFormatSections = 4;

// What one piece of the output is. Values are stable: the Python layer mirrors them.
enum class PieceKind : std::uint8_t {
  Frame = 0,      // formatter text: section tags, the joins between sections, the safety sentence
  Directive = 1,  // "\n" + the directive
  Message = 2,    // "\n<message role=...>...</message>"
  Memory = 3,     // "\n<memory nonce=... id=...>...</memory>"
  Tools = 4,      // "\n" + the tool schemas' JSON
};

// Bad input to the serializer. `section` is where the problem is; `index` the offending
// item's position in its section (or -1); `item_id` a memory's id when it has one.
class InvalidFormatInput : public std::invalid_argument {
 public:
  InvalidFormatInput(const std::string& message, FormatSection section, std::int64_t index, std::string item_id = {})
      : std::invalid_argument(message), section_(section), index_(index), item_id_(std::move(item_id)) {}
  FormatSection section() const noexcept { return section_; }
  std::int64_t index() const noexcept { return index_; }
  const std::string& item_id() const noexcept { return item_id_; }

 private:
  FormatSection section_;
  std::int64_t index_;
  std::string item_id_;
};

// All strings are UTF-8. A surrogate code point written as three bytes (ED A0..BF xx,
// what Python's "surrogatepass" produces) is read as that one code point; any other
// ill-formed sequence is replaced, one U+FFFD per maximal ill-formed subpart.
struct Message {
  std::string_view role;     // non-empty; written as an attribute value
  std::string_view content;  // written as escaped text
};

struct Memory {
  std::string_view id;      // non-empty; written as an attribute value
  std::string_view text;    // written as escaped text
  std::string_view source;  // written as an attribute value when has_source
  double score = 0.0;       // finite; written in shortest round-trip form when has_score
  bool has_score = false;
  bool has_source = false;
  std::string_view created_at{};  // written as an attribute value when has_created_at
  bool has_created_at = false;
};

struct FormatInput {
  std::string_view directive;   // operator text, written as given (illegal characters replaced); empty: no section
  View<Message> history;        // empty: no section
  View<Memory> memories;        // empty: no section (unless FormatOptions::memories_frame)
  std::string_view tools_json;  // JSON text of the tool schemas; empty: no section
  std::string_view nonce;       // verbose: >= kMinNonceHexDigits lowercase hex digits; compact: is_valid_compact_nonce
};

// How memory elements are written. Values are stable: the Python layer mirrors them.
//   Verbose: <memory nonce="{hex}" id=".." score=".." source="..">..</memory>, kSafetySentence
//   (created_at="..", after source, in either rendering when has_created_at)
//   Compact: <m {handle}="{nonce}" score=".." source="..">..</m>, kCompactSafetySentence;
//            the memory's id must be a handle (is_compact_handle), an attribute name
// Both escape every attribute value and body the same way.
enum class MemoryFormat : std::uint8_t { Verbose = 0, Compact = 1 };

struct FormatOptions {
  // Write the memories section's frame even with no memories: what the overhead is priced
  // against, since any selected memory brings the frame with it.
  bool memories_frame = false;
  // Record where every piece ends (FormattedText::pieces).
  bool record_pieces = false;
  // The rendering of memory elements; it decides the nonce's alphabet (see is_valid_nonce).
  MemoryFormat memory_format = MemoryFormat::Verbose;
};

// Offsets into the text, in bytes and in code points (what a caller holding the text in
// another encoding indexes by).
struct Offset {
  std::size_t byte = 0;
  std::size_t code_point = 0;
};

struct SectionSpan {
  FormatSection section;
  Offset begin;  // the section runs from its opening tag
  Offset end;    // to the end of its closing tag
};

struct Piece {
  PieceKind kind;
  Offset end;  // a piece starts where the previous one ends
};

struct FormattedText {
  std::string text;                   // valid UTF-8, XML 1.0 characters only
  std::vector<SectionSpan> sections;  // present sections, in order
  std::vector<Piece> pieces;          // empty unless FormatOptions::record_pieces
  std::int64_t replaced_chars = 0;    // code points (or ill-formed subparts) replaced by U+FFFD
  std::size_t code_points = 0;        // length of text in code points
  char32_t max_code_point = 0;        // largest code point in text, at least 0x7F (0 when empty)
};

// The text between <memories> and the first memory. Fixed, so its cost is fixed.
extern const std::string_view kSafetySentence;
// The same for the compact rendering: the same meaning in fewer tokens.
extern const std::string_view kCompactSafetySentence;

// Throws InvalidFormatInput for a bad nonce, an empty id or role, a compact id that is not
// a handle, or a non-finite score.
FormattedText format_context(const FormatInput& input, const FormatOptions& options = {});

// The escapers, one pass each, appending to `out` and adding replacements to `replaced`.
// Every input byte becomes at most kMaxGrowth output bytes.
// Text: & < > and CR become references; tab and LF stay. Attribute value (for a
// double-quoted attribute): additionally " ' tab LF become references, so that every
// character survives attribute-value normalization. JSON: < > & become \u escapes (the
// same JSON value, no markup), surrogates and U+FFFE/U+FFFF become \u escapes (exact),
// raw C0 controls become \u escapes and CR a character reference. Raw: nothing escaped,
// only illegal characters replaced.
void append_escaped_text(std::string& out, std::string_view utf8, std::int64_t& replaced);
void append_escaped_attribute(std::string& out, std::string_view utf8, std::int64_t& replaced);
void append_escaped_json(std::string& out, std::string_view utf8, std::int64_t& replaced);
void append_sanitized(std::string& out, std::string_view utf8, std::int64_t& replaced);

// True when `nonce` is at least kMinNonceHexDigits lowercase hex digits and nothing else.
bool is_valid_nonce(std::string_view nonce) noexcept;
// True when `nonce` has one of the compact rendering's forms (see kMinCompactNonceWords).
bool is_valid_compact_nonce(std::string_view nonce) noexcept;
// True when `id` is a compact handle: "m", then 1 to kMaxCompactHandleChars - 1 decimal
// digits, the first not 0.
bool is_compact_handle(std::string_view id) noexcept;

}  // namespace ctxcore

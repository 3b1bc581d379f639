// The conservative token estimator: how many tokens a text will cost, without running a
// tokenizer. It sits beside the budget: the budget, the formatter's overhead and every
// candidate's cost are priced with it when an exact count is unavailable or too slow.
// Plain C++17, no Python.
//
// The model: a text's token count is the sum, over its code points, of the expected number
// of tokens that start inside each code point, given that code point and the one before
// it. Those expectations live in tables of code-point pairs (learned from
// exact tokenizations): pairs of two Latin-1 code points index a direct table
// (`latin_costs`), every other pair is hashed into `pair_entries`, whose entries carry a
// 16-bit tag of the pair they were learned from, so that a pair landing on another pair's
// entry is recognized as unseen rather than given that pair's cost. A
// pair the table has never seen falls back to the average of the code point's
// 32-code-point block (`block_costs`), which stands in for its script. The sum `raw`, of
// which `sure` is priced as whole vocabulary words (one token each, known) and `rest` by
// averages, becomes the estimate ceil(word_scale * sure + scale * rest + spread *
// sqrt(rest)), at least 1 for non-empty text: a margin on what is estimated only,
// relatively wide for short texts (where a sum of averages strays furthest) and narrow
// for long ones. Tables, scale and spread are calibrated per
// tokenizer family and passed in by the caller: the core holds none of them.
//
// Properties that hold for any parameters that pass validate(): empty text costs exactly
// 0, non-empty text at least 1; the estimate is never negative; appending text never
// lowers it (each code point's cost depends only on it and its predecessor, so a prefix's
// costs are a subset of the whole's, and every cost is >= 0; a word, below, costs at least
// its leading character's pair cost, and the last word is priced as a word only while some
// vocabulary word still starts with it, so no completion costs less; cost moves from the
// sure part to the estimated one only, never back, and word_scale <= scale).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ctxcore/packer.hpp"

namespace ctxcore {

// Costs are fixed point: this many units per token (uint16 holds up to ~64 tokens).
inline constexpr double kCostUnit = 1024.0;
// A cost equal to this means "pair never seen: use the block cost".
inline constexpr std::uint16_t kUnseenPair = 0xFFFF;
// Block of a code point: cp >> kBlockShift below kBlockLimit, else the last block.
inline constexpr unsigned kBlockShift = 5;
inline constexpr char32_t kBlockLimit = 0x30000;  // past the CJK extensions; beyond is rare
inline constexpr std::size_t kBlocks = (kBlockLimit >> kBlockShift) + 1;
// The direct table: kLatinPairs entries, (prev << 8) | cp for two code points below 256
// (prev is 0 at the start of a text).
inline constexpr std::size_t kLatinPairs = 256 * 256;
// A hashed entry is (tag << 16) | cost; a cost of kUnseenPair marks an empty entry.
inline constexpr unsigned kMinPairBits = 1;
inline constexpr unsigned kMaxPairBits = 24;

// ---- the word model ----------------------------------------------------------------------
// Optional, per family: a tokenizer whose pre-tokenizer cuts text into chunks (words with one
// leading space or punctuation character, number groups, punctuation runs, whitespace runs)
// and that encodes a chunk found whole in its vocabulary as one token. The word model mirrors
// that chunking for letter runs (a "word": a maximal run of letters, split where the
// family's pattern splits it, plus the single leading character the pattern attaches) and
// looks each complete word up in a set of the family's vocabulary words. A word found there
// costs `word_cost` units (one token) instead of the sum of its pair costs, and never more
// than that sum; a word not found is split by the tokenizer into two tokens or more, so it
// costs the larger of its pair costs and twice `word_cost`; every other code point keeps its
// pair cost. The text's last word, which appending may still extend, gets the word price
// only while it is a prefix of a vocabulary word (so appending never lowers the estimate).
// A code point past ASCII that is not itself a vocabulary token (one of the "words" of a
// single code point, which the vocabulary list also carries for punctuation and symbols) is
// split into two byte-level tokens or more: it costs at least two word prices; one that is
// a token, repeated, at least one, and so does an ASCII control character other than tab,
// CR and LF (each is its own token). An ASCII character (digits aside) that repeats the one
// before it costs at least a token over the longest run of it the vocabulary holds as one
// token (its "words" list carries those runs): 395 "&" are 198 tokens, 377 "q" 189. ASCII digits cost one word price
// for the first digit of every group of three (the patterns cut numbers so, and every group is one token). With mode
// kNoWords, or without a vocabulary, the estimator is the plain pair model.

// Code-point classes, as the pre-tokenizer patterns distinguish them.
enum CharClass : std::uint8_t {
  kClassOther = 0,        // punctuation, symbols, controls, unassigned
  kClassLower = 1,        // Ll
  kClassUpper = 2,        // Lu, Lt
  kClassLetterOther = 3,  // Lm, Lo
  kClassMark = 4,         // Mn, Mc, Me
  kClassNumber = 5,       // Nd, Nl, No
  kClassNewline = 6,      // \r, \n
  kClassSpace = 7,        // other White_Space
  kClassCount = 8,
};
// Classes are given for code points below this; past it, U+30000..U+323AF (CJK extensions)
// are kClassLetterOther and the rest kClassOther.
inline constexpr std::size_t kClassLimit = 0x30000;
// The longest vocabulary word the model takes, in code points.
inline constexpr std::size_t kMaxWordCodePoints = 128;

// How a family's pattern forms words. kWordsCl100k: letters are \p{L}; a mark is not a
// letter. kWordsO200k: letters and marks, and a word ends before an upper-case letter that
// follows a lower-case one ("helloWorld" -> "hello", "World").
enum WordMode : unsigned { kNoWords = 0, kWordsCl100k = 1, kWordsO200k = 2 };

// A set of word hashes, open-addressed by buckets of eight: a hash's bucket is taken from
// its high 32 bits, its fingerprint (never 0, the empty slot) is its low 32 bits, and a
// bucket that is full continues into the next one. A word outside the set is taken for one
// of it only when its fingerprint matches one in its bucket (four to eight of them), about
// once in 2^30 lookups.
struct alignas(32) WordBucket {
  std::uint32_t fp[8];
};
struct WordSet {
  std::vector<WordBucket> buckets;  // a power of two of them
};

struct WordModel {
  unsigned mode = kNoWords;
  std::vector<std::uint8_t> classes;  // kClassLimit entries
  WordSet words;                      // the hashes of the vocabulary words
  WordSet prefixes;                   // the hashes of their proper prefixes that are no word
  std::vector<std::uint64_t> single;  // bit per code point below kClassLimit: a token by itself
  std::vector<std::uint8_t> run_max;  // 128 entries: longest vocabulary run of one ASCII character
  std::size_t max_word = 0;           // longest word, in code points
  std::uint32_t cost = 0;             // cost units of a word found in the vocabulary
};

// Tables derived from a family's parameters by prepare(), for the scan that prices a whole
// text in two passes (costs and classes of every code point first, then the words).
struct ScanTables {
  // kLatinPairs entries (and two spare, for 4-byte reads of the last), indexed (cp << 8) |
  // prev: the cost of a code point below 256 after one below 256, in cost units, with every
  // adjustment that depends on the two only (a code point past ASCII that is no token by
  // itself, a repeated token, a control character, a repeated ASCII character); an ASCII
  // digit costs one word price after anything but an ASCII digit and 0 after one (the scan
  // adds the word price of every third digit past that).
  std::vector<std::uint16_t> pairs;
  // kClassLimit entries: the code point's class, and flags: kScanLetter when the family's
  // pattern takes it into words, kScanAttach when the pattern attaches it in front of a
  // word, kScanDigit for the ASCII digits, kScanFloor for a code point past ASCII that is no
  // token by itself, kScanControl for an ASCII control character other than tab, LF and CR.
  std::vector<std::uint8_t> info;
  // Whether the ASCII classes are those of Unicode (letters a-z and A-Z, digits, CR and LF
  // the newlines, `spaces` the other white space, the rest punctuation), so that the scan
  // tells them apart with a few compares on 16 code points at a time.
  bool ascii_standard = false;
  std::uint8_t spaces[4] = {0, 0, 0, 0};
  // Whether the CPU runs the AVX2 forms of the scan's inner loops (the same numbers; clear
  // it to run the baseline forms).
  bool avx2 = false;
};
// The scan reads texts in segments of this many code points.
inline constexpr std::size_t kScanSegment = 1024;
inline constexpr std::uint8_t kScanClassMask = 0x07;
inline constexpr std::uint8_t kScanFloor = 0x08;
inline constexpr std::uint8_t kScanLetter = 0x10;
inline constexpr std::uint8_t kScanControl = 0x20;
inline constexpr std::uint8_t kScanAttach = 0x40;
inline constexpr std::uint8_t kScanDigit = 0x80;

// The calibrated parameters of one tokenizer family.
struct EstimatorParams {
  unsigned pair_bits = 0;                   // pair_entries has 2^pair_bits entries
  std::vector<std::uint16_t> latin_costs;   // kLatinPairs entries: cost units, or kUnseenPair
  std::vector<std::uint32_t> pair_entries;  // (tag << 16) | cost units
  std::vector<std::uint16_t> block_costs;   // kBlocks entries, cost units
  double scale = 1.0;                       // >= 0
  double spread = 0.0;                      // >= 0
  double word_scale = 1.0;                  // >= 0: the factor on whole vocabulary words
  WordModel words;                          // optional (mode kNoWords: none)
  ScanTables scan;                          // derived by prepare(); empty: every text is walked
};

// A text's raw cost in cost units, and the part of it priced as whole vocabulary words
// (`sure`, at most `units`): those are one token each whatever surrounds them, so the
// margin for the estimate's error applies to the rest only.
struct RawCost {
  std::uint64_t units = 0;
  std::uint64_t sure = 0;
};

// Sets `params.words`: mode, the class of every code point below kClassLimit, the vocabulary
// words as UTF-8 separated by NUL bytes (a word never holds U+0000), and the cost of a word found there (cost units, at
// most 64 tokens). Throws std::invalid_argument naming what is wrong (mode, class table size or values, a word that is
// empty or not valid UTF-8, the cost).
void set_words(EstimatorParams& params, unsigned mode, std::vector<std::uint8_t> classes, std::string_view words_utf8,
               std::uint32_t cost);

// Throws std::invalid_argument naming what is wrong (sizes, bits, scale, spread, word_scale).
void validate(const EstimatorParams& params);

// Validates `params` and derives `params.scan` from its tables and word model, so that
// whole texts (of 16 code points or more) are priced by the two-pass scan (the same
// estimates as the walk, faster).
// Recompute after changing the tables or the word model; without it (scan empty) every
// text is walked one code point at a time.
void prepare(EstimatorParams& params);

// Where the pair (prev, cp) lives: a direct index into latin_costs when both are below
// 256 (then `tag` is 0), else an index into pair_entries and the tag its entry must carry.
struct PairSlot {
  std::size_t index;
  std::uint32_t tag;
  bool direct;
};

inline PairSlot pair_slot(char32_t prev, char32_t cp, unsigned bits) noexcept {
  if ((prev | cp) < 256) return {(static_cast<std::size_t>(prev) << 8) | cp, 0, true};
  const std::uint32_t g = (static_cast<std::uint32_t>(prev) * 0x9E3779B1u) ^ static_cast<std::uint32_t>(cp);
  const std::uint32_t h = g * 0x85EBCA77u;
  return {static_cast<std::size_t>(h >> (32u - bits)), (g ^ (g >> 16)) & 0xFFFFu, false};
}

inline std::size_t block_of(char32_t cp) noexcept {
  return cp < kBlockLimit ? static_cast<std::size_t>(cp >> kBlockShift) : kBlocks - 1;
}

// A text as code points in fixed-width units of `width` bytes: 1 (Latin-1), 2 (UCS-2) or
// 4 (UCS-4); the form in which language runtimes commonly hold their strings.
struct CodePoints {
  const void* data = nullptr;
  std::size_t size = 0;  // code points
  unsigned width = 1;
};

// The raw cost (in cost units) of a text given as code points in fixed-width units:
// std::uint8_t (Latin-1), std::uint16_t (UCS-2) or char32_t / std::uint32_t (UCS-4).
template <class Unit>
RawCost raw_cost(const Unit* cps, std::size_t n, const EstimatorParams& params) noexcept;

// The same for UTF-8; a byte that is not part of valid UTF-8 counts as one U+FFFD.
RawCost raw_cost_utf8(std::string_view utf8, const EstimatorParams& params);

// The raw cost of code points in fixed-width units (width 1, 2 or 4), as estimate_tokens sums it.
RawCost raw_cost(const CodePoints& text, const EstimatorParams& params) noexcept;

// The same, always by the walk over one code point at a time (never the two-pass scan):
// for tests that hold the scan to it.
RawCost raw_cost_walked(const CodePoints& text, const EstimatorParams& params) noexcept;

// Calls on_word(begin, end, found) for each word of `text` (code-point offsets; the leading
// character the pattern attaches included) that the word model prices: `found` when it is a
// vocabulary word. Nothing when the model has no words. For the calibration.
void for_each_word(const CodePoints& text, const EstimatorParams& params,
                   const std::function<void(std::size_t, std::size_t, bool)>& on_word);

// ceil(word_scale * sure + scale * rest + spread * sqrt(rest)) in tokens, where `rest` is the
// raw cost not priced as whole vocabulary words; at least 1 when `nonempty`.
std::int64_t finish_estimate(RawCost raw, bool nonempty, const EstimatorParams& params) noexcept;

// The estimate for one UTF-8 text. `params` must have passed validate().
std::int64_t estimate_tokens(std::string_view utf8, const EstimatorParams& params);

// The estimates for many UTF-8 texts, written to out[0 .. texts.size).
void estimate_tokens_batch(View<std::string_view> texts, const EstimatorParams& params, std::int64_t* out);

// The estimate for code points in fixed-width units; same result as the UTF-8 form.
std::int64_t estimate_tokens(const CodePoints& text, const EstimatorParams& params) noexcept;

// The estimates for many texts in fixed-width units, written to out[0 .. texts.size).
void estimate_tokens_batch(View<CodePoints> texts, const EstimatorParams& params, std::int64_t* out) noexcept;

// Prices consecutive pieces of one text, for the formatter's overhead. Piece k is the code
// points [ends[k-1], ends[k]) of `text` (ends[-1] = 0). Piece 0, and any piece at the very
// start, is estimated as it is; every other piece as if preceded by one code point: the
// one before it in `text`, or, where `any_prefix[k]` is set (a piece whose neighbour is
// not known yet, like a memory before packing), whichever of `prefix_a` and `prefix_b`
// gives the larger estimate. A preceding code point only adds raw cost, so these prices
// bound the estimate of any text made of the pieces. Equal to estimating each prefixed
// piece as its own string. Throws std::invalid_argument when `ends` is not
// non-decreasing within the text or `any_prefix` has another length.
void price_pieces(const CodePoints& text, View<std::int64_t> ends, View<std::uint8_t> any_prefix, char32_t prefix_a,
                  char32_t prefix_b, const EstimatorParams& params, std::int64_t* out);

}  // namespace ctxcore

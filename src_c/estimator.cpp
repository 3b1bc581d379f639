// The conservative token estimator. See estimator.hpp for the model; this file is the walk
// over the code points that defines a text's raw cost, the scan that computes the same raw
// cost for whole texts faster (raw_cost), and the margin applied to it (finish_estimate).
#include "ctxcore/estimator.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#define CTXCORE_SSE2 1
#include <emmintrin.h>
#endif
// AVX2 code is compiled for its functions only and run where the CPU has it (the build
// targets baseline x86-64).
#if defined(CTXCORE_SSE2) && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define CTXCORE_AVX2 1
#include <immintrin.h>
#endif
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#define CTXCORE_INLINE __forceinline
#else
#define CTXCORE_INLINE __attribute__((always_inline))
#endif

namespace ctxcore {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

// Decodes one code point at s[i]. Returns its length in bytes (1-4), or 0 when the bytes
// there are not valid UTF-8 (overlong forms, surrogates and values past U+10FFFF included).
std::size_t decode(std::string_view s, std::size_t i, char32_t& cp) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  std::size_t len = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1Fu;
    min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0Fu;
    min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07u;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// Calls f(cp) for every code point of a UTF-8 text; invalid bytes become U+FFFD.
template <class F>
void for_each_utf8(std::string_view s, F&& f) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    const std::size_t len = decode(s, i, cp);
    if (len == 0) {
      f(kReplacement);
      ++i;
    } else {
      f(cp);
      i += len;
    }
  }
}

// The cost of one code point after `prev`, in cost units.
inline std::uint64_t cost(char32_t prev, char32_t cp, const EstimatorParams& p) noexcept {
  const PairSlot slot = pair_slot(prev, cp, p.pair_bits);
  if (slot.direct) {
    const std::uint16_t c = p.latin_costs[slot.index];
    if (c != kUnseenPair) return c;
  } else {
    const std::uint32_t e = p.pair_entries[slot.index];
    const std::uint32_t c = e & 0xFFFFu;
    if (c != kUnseenPair && (e >> 16) == slot.tag) return c;
  }
  return p.block_costs[block_of(cp)];
}

// ---- the word model ----------------------------------------------------------------------

constexpr std::uint8_t kClassStart = kClassCount;  // "no code point": the start of the text

inline std::uint8_t class_of(char32_t cp, const WordModel& w) noexcept {
  if (cp < kClassLimit) return w.classes[cp];
  return cp < 0x323B0 ? kClassLetterOther : kClassOther;
}

inline bool is_letter(std::uint8_t k, bool o200k) noexcept {
  return (k >= kClassLower && k <= kClassLetterOther) || (o200k && k == kClassMark);
}

// A character the pattern attaches in front of a word: [^\r\n\p{L}\p{N}].
inline bool attachable(std::uint8_t k, bool o200k) noexcept {
  return k == kClassOther || k == kClassSpace || (!o200k && k == kClassMark);
}

// Whether a chunk ends before a character of class `k`'s successor begins a new one: after a
// letter, a number, a newline or at the start, a single punctuation character begins a chunk
// (and attaches to a word after it); after punctuation or a space it continues their run.
inline bool ends_chunk(std::uint8_t k, bool o200k) noexcept {
  return k == kClassStart || is_letter(k, o200k) || k == kClassNumber || k == kClassNewline;
}

// ---- word hashes and word sets -----------------------------------------------------------
// A word is hashed in its canonical form: its code points as bytes when all are below 256,
// else as little-endian 16-bit units when all are below 0x10000, else as 32-bit units; so a
// word hashes the same whether its text is held as Latin-1, UCS-2 or UCS-4, and the words of
// a Latin-1 text (and the wide words of a UCS-2 one) are hashed where they lie. The bytes are
// read as little-endian 64-bit words, the last one padded with zeros, and mixed two at a time
// by 64 x 64 -> 128-bit products (wyhash's mixing): one product for a word of up to 16 bytes.

constexpr std::uint64_t kHash0 = 0xA0761D6478BD642Full;
constexpr std::uint64_t kHash1 = 0xE7037ED1A0B428DBull;
constexpr std::uint64_t kHash2 = 0x8EBC6AF09C88C6E3ull;
constexpr std::uint64_t kHash3 = 0x589965CC75374CC3ull;

inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__SIZEOF_INT128__)
  __extension__ typedef unsigned __int128 U128;
  const U128 r = static_cast<U128>(a) * b;
  return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
#elif defined(_MSC_VER) && defined(_M_X64)
  std::uint64_t hi = 0;
  const std::uint64_t lo = _umul128(a, b, &hi);
  return lo ^ hi;
#else
  // 64 x 64 -> 128 from 32-bit halves.
  const std::uint64_t al = a & 0xFFFFFFFFu, ah = a >> 32, bl = b & 0xFFFFFFFFu, bh = b >> 32;
  const std::uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
  const std::uint64_t mid = (ll >> 32) + (lh & 0xFFFFFFFFu) + (hl & 0xFFFFFFFFu);
  const std::uint64_t lo = (mid << 32) | (ll & 0xFFFFFFFFu);
  const std::uint64_t hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
  return lo ^ hi;
#endif
}

inline std::uint64_t load64(const void* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline unsigned clz64(std::uint64_t x) noexcept {  // x != 0
#if defined(_MSC_VER) && !defined(__clang__)
  unsigned long i;
  _BitScanReverse64(&i, x);
  return 63 - static_cast<unsigned>(i);
#else
  return static_cast<unsigned>(__builtin_clzll(x));
#endif
}

inline unsigned ctz64(std::uint64_t x) noexcept {
#if defined(_MSC_VER) && !defined(__clang__)
  unsigned long i;
  _BitScanForward64(&i, x);
  return static_cast<unsigned>(i);
#else
  return static_cast<unsigned>(__builtin_ctzll(x));
#endif
}

inline unsigned popcount64(std::uint64_t x) noexcept {
#if defined(__POPCNT__)
  return static_cast<unsigned>(__builtin_popcountll(x));
#else
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
  return static_cast<unsigned>((x * 0x0101010101010101ull) >> 56);
#endif
}

// The r < 8 bytes at p as a little-endian number, reading only inside [lo, hi) (which
// holds [p, p + r)).
inline std::uint64_t load_partial(const std::uint8_t* p, std::size_t r, const std::uint8_t* lo,
                                  const std::uint8_t* hi) noexcept {
  if (r == 0) return 0;
  if (hi - p >= 8) return load64(p) & ((std::uint64_t{1} << (8 * r)) - 1);
  if (p + r - lo >= 8) return load64(p + r - 8) >> (8 * (8 - r));
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < r; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// The hash of `len` canonical bytes of width `width` at p, reading only inside [lo, hi).
inline CTXCORE_INLINE std::uint64_t hash_bytes(const std::uint8_t* p, std::size_t len, unsigned width,
                                               const std::uint8_t* lo, const std::uint8_t* hi) noexcept {
  const std::uint64_t lw = len | (std::uint64_t{width} << 16);
  if (len <= 16) {
    const std::uint64_t a = len >= 8 ? load64(p) : load_partial(p, len, lo, hi);
    const std::uint64_t b = len > 8 ? load64(p + len - 8) >> (8 * (16 - len)) : 0;
    return mix(a ^ kHash1, b ^ kHash2 ^ lw);
  }
  std::uint64_t h = kHash0 ^ lw;
  std::size_t i = 0;
  for (; i + 16 <= len; i += 16) h = mix(load64(p + i) ^ kHash1, load64(p + i + 8) ^ kHash2 ^ h);
  const std::size_t rest = len - i;
  if (rest >= 8) {
    const std::uint64_t b = rest == 8 ? 0 : load64(p + i + rest - 8) >> (8 * (16 - rest));
    h = mix(load64(p + i) ^ kHash1, b ^ kHash2 ^ h);
  } else if (rest > 0) {
    h = mix(load_partial(p + i, rest, lo, hi) ^ kHash1, kHash2 ^ h);
  }
  return mix(h ^ kHash3, lw ^ kHash1);
}

// The hash of the word [cps, cps + n), n <= kMaxWordCodePoints, in any width.
template <class Unit>
std::uint64_t word_hash(const Unit* cps, std::size_t n) noexcept {
  if constexpr (sizeof(Unit) == 1) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(cps);
    return hash_bytes(b, n, 1, b, b + n);
  } else {
    std::uint32_t top = 0;
    for (std::size_t i = 0; i < n; ++i) top |= static_cast<std::uint32_t>(cps[i]);
    const unsigned width = top < 0x100 ? 1 : top < 0x10000 ? 2 : 4;
#if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
    if (width == sizeof(Unit)) {  // the units are the canonical bytes
      const auto* b = reinterpret_cast<const std::uint8_t*>(cps);
      return hash_bytes(b, n * width, width, b, b + n * width);
    }
#endif
    std::uint8_t buf[4 * kMaxWordCodePoints + 8];
    std::size_t len = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto c = static_cast<std::uint32_t>(cps[i]);
      for (unsigned k = 0; k < width; ++k) buf[len++] = static_cast<std::uint8_t>(c >> (8 * k));
    }
    std::memset(buf + len, 0, 8);
    return hash_bytes(buf, len, width, buf, buf + len + 8);
  }
}

inline std::uint32_t fingerprint(std::uint64_t h) noexcept {
  const auto fp = static_cast<std::uint32_t>(h);
  return fp + (fp == 0);
}

inline std::size_t bucket_of(const WordSet& s, std::uint64_t h) noexcept {
  return static_cast<std::size_t>(h >> 32) & (s.buckets.size() - 1);
}

// Whether `s` holds the hash h (a false positive needs a 32-bit fingerprint to match).
inline bool contains(const WordSet& s, std::uint64_t h) noexcept {
  const std::uint32_t fp = fingerprint(h);
  const std::size_t mask = s.buckets.size() - 1;
  std::size_t b = bucket_of(s, h);
  for (;;) {
    const WordBucket& k = s.buckets[b];
#if defined(CTXCORE_SSE2)
    const __m128i f = _mm_set1_epi32(static_cast<int>(fp));
    const auto* v = reinterpret_cast<const __m128i*>(k.fp);
    const __m128i eq = _mm_or_si128(_mm_cmpeq_epi32(_mm_load_si128(v), f), _mm_cmpeq_epi32(_mm_load_si128(v + 1), f));
    if (_mm_movemask_epi8(eq) != 0) return true;
#else
    unsigned hit = 0;
    for (const std::uint32_t e : k.fp) hit |= static_cast<unsigned>(e == fp);
    if (hit != 0) return true;
#endif
    if (k.fp[7] == 0) return false;  // slots fill in order: a bucket with room ends the probe
    b = (b + 1) & mask;
  }
}

// contains(), for the common case inlined: one bucket read and compared without a branch on
// the outcome (a full bucket that does not hold h sends the probe on, rarely).
inline bool probe(const WordSet& s, const WordBucket* table, std::size_t mask, std::uint64_t h) noexcept {
#if defined(CTXCORE_SSE2)
  const WordBucket& k = table[static_cast<std::size_t>(h >> 32) & mask];
  const __m128i f = _mm_set1_epi32(static_cast<int>(fingerprint(h)));
  const auto* v = reinterpret_cast<const __m128i*>(k.fp);
  const __m128i eq = _mm_or_si128(_mm_cmpeq_epi32(_mm_load_si128(v), f), _mm_cmpeq_epi32(_mm_load_si128(v + 1), f));
  const int hit = _mm_movemask_epi8(eq);
  // Found or not, one bucket decides unless it is full and does not hold h (rare): no
  // branch on the outcome.
  if ((static_cast<unsigned>(hit == 0) & static_cast<unsigned>(k.fp[7] != 0)) != 0) return contains(s, h);
  return hit != 0;
#else
  const WordBucket& k = table[static_cast<std::size_t>(h >> 32) & mask];
  const std::uint32_t fp = fingerprint(h);
  unsigned hit = 0;
  for (const std::uint32_t e : k.fp) hit |= static_cast<unsigned>(e == fp);
  if ((static_cast<unsigned>(hit == 0) & static_cast<unsigned>(k.fp[7] != 0)) != 0) return contains(s, h);
  return hit != 0;
#endif
}

inline void prefetch(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#elif defined(CTXCORE_SSE2)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#endif
}

// Fills `s` with `hashes`, at most `per_bucket` (< 8) to a bucket on average.
void build_set(WordSet& s, const std::vector<std::uint64_t>& hashes, std::size_t per_bucket) {
  std::size_t count = 1;
  while (count * per_bucket < hashes.size()) count <<= 1;
  s.buckets.assign(count, WordBucket{});
  for (const std::uint64_t h : hashes) {
    const std::uint32_t fp = fingerprint(h);
    for (std::size_t b = bucket_of(s, h);; b = (b + 1) & (count - 1)) {
      std::uint32_t* slots = s.buckets[b].fp;
      std::size_t i = 0;
      while (i < 8 && slots[i] != 0 && slots[i] != fp) ++i;
      if (i < 8) {
        slots[i] = fp;
        break;
      }
    }
  }
}

struct NoWords {
  void operator()(std::size_t, std::size_t, bool) const noexcept {}
};

// The raw cost of [cps, cps + n) with the word model. `prev` is the code point before the
// text (0: none). `first_credit`: a word that begins at index 0 may get the word price (false
// for a piece of a longer text, whose first word may be the tail of a longer one).
// `last_open`: the last word may still be extended by text that follows (the end of a whole
// text: word price while it is a vocabulary word or a vocabulary word's prefix); else it is
// priced by its pairs.
template <class Unit, class OnWord>
RawCost walk(const Unit* cps, std::size_t n, const EstimatorParams& p, char32_t prev, bool first_credit, bool last_open,
             OnWord&& on_word) {
  const WordModel& w = p.words;
  const bool o200k = w.mode == kWordsO200k;
  const std::uint64_t floor = 2 * std::uint64_t{w.cost};  // two tokens
  std::uint64_t total = 0, run = 0, last = 0, lead = 0;
  // The part of `total` priced as whole vocabulary words (with the leading character each
  // takes along): one token each whatever surrounds them, known rather than estimated.
  std::uint64_t sure = 0;
  std::size_t start = 0;
  bool in_run = false, credit = false, lower = false;
  std::uint8_t k1 = prev != 0 ? class_of(prev, w) : kClassStart;  // class of cps[i - 1]
  std::uint8_t k2 = kClassStart;                                  // class of cps[i - 2]
  // A word found in the vocabulary is one token: the word price, never below its leading
  // character's pair cost (its pairs may sum to less: they are averages over contexts, and
  // the pattern makes the word one token whatever they say). One not found is at least two
  // tokens.
  const auto priced = [&](bool found) { return found ? std::max<std::uint64_t>(w.cost, lead) : std::max(run, floor); };
  const auto close = [&](std::size_t end, bool open) -> std::uint64_t {
    if (!credit) return std::max(run, floor);
    // No vocabulary word is longer than max_word code points: a longer one is not looked up.
    const bool short_enough = end - start <= w.max_word;
    const std::uint64_t h = short_enough ? word_hash(cps + start, end - start) : 0;
    const bool whole = short_enough && contains(w.words, h);
    on_word(start, end, whole);
    bool found = whole;
    if (open) {
      if (!last_open) return std::max(run, floor);
      found = whole || (short_enough && contains(w.prefixes, h));
    }
    const std::uint64_t price = priced(found);
    // A vocabulary word is one token whatever surrounds it: known, not estimated. A
    // vocabulary word's prefix ending the text is priced the same way, so that the text
    // growing into the word leaves the estimate as it was.
    if (found) sure += price;
    return price;
  };
  std::size_t digits = 0;  // ASCII digits in a row so far
  for (std::size_t i = 0; i < n; ++i) {
    const auto cp = static_cast<char32_t>(cps[i]);
    std::uint64_t c = cost(prev, cp, p);
    const std::uint8_t k = class_of(cp, w);
    if (cp >= '0' && cp <= '9') {
      // The patterns cut digits into groups of up to three, each one token: exactly one
      // token for the first digit of every group.
      c = digits % 3 == 0 ? std::uint64_t{w.cost} : 0;
      ++digits;
    } else {
      digits = 0;
      if (cp >= 0x80) {
        if (!(cp < kClassLimit && ((w.single[cp >> 6] >> (cp & 63)) & 1u))) {
          c = std::max(c, floor);  // no token by itself: two byte-level tokens or more
        } else if (cp == prev) {
          c = std::max<std::uint64_t>(c, w.cost);  // a repeated token: rarely merged
        }
      } else if ((cp < 0x20 || cp == 0x7F) && cp != '\t' && cp != '\n' && cp != '\r') {
        c = std::max<std::uint64_t>(c, w.cost);  // a control character: its own token
      } else if (cp == prev && w.run_max[cp] != 0) {
        c = std::max<std::uint64_t>(c, w.cost / w.run_max[cp]);  // a run: no token holds more
      }
    }
    const bool letter = is_letter(k, o200k);
    if (in_run) {
      if (letter && !(o200k && lower && k == kClassUpper)) {
        run += c;
        lower = lower || k == kClassLower;
        k2 = k1;
        k1 = k;
        prev = cp;
        last = c;
        continue;
      }
      total += close(i, false);
      in_run = false;
    }
    if (letter) {
      in_run = true;
      lower = k == kClassLower;
      credit = first_credit || i > 0;
      if (i > 0 && attachable(k1, o200k) && (k1 == kClassSpace || ends_chunk(k2, o200k))) {
        total -= last;  // the leading character moves into the word
        lead = last;
        run = last + c;
        start = i - 1;
      } else {
        lead = 0;
        run = c;
        start = i;
      }
    } else {
      total += c;
    }
    k2 = k1;
    k1 = k;
    prev = cp;
    last = c;
  }
  if (in_run) {
    total += close(n, true);
  } else if (n > 0 && attachable(k1, o200k) && (k1 == kClassSpace || ends_chunk(k2, o200k))) {
    // A character that a following letter would take into its word ends the text (or the
    // piece): priced as sure, so that the letter moving it into a vocabulary word (sure)
    // does not lower the estimate. Appending anything else moves it back to the estimated
    // part, which costs at least as much (scale >= word_scale). A piece is priced the way
    // its text alone would be, the piece after it not knowing the word it may join.
    sure += last;
  }
  return RawCost{total, sure};
}

// ---- the scan ----------------------------------------------------------------------------
// The walk above, for a whole text, in two passes over segments of kScanSegment code points.
// The first finds every code point's cost and keeps their running sums, and sets its bit in
// masks of its class (letters, attachable characters, spaces, ASCII digits; for o200k_base
// also upper- and lower-case letters and the other letters), 16 code points at a time:
// blocks of code points below 256 (every block of a Latin-1 text, and most of the others)
// take each cost from one table read indexed by the pair's two bytes (ScanTables::pairs)
// and, when all are ASCII, their classes from a few vector compares; other blocks read each
// code point's class byte (ScanTables::info) and work out each cost without a branch on it
// (with AVX2 eight at a time, by gathers). The second finds the words with mask arithmetic
// (letter runs, the splits o200k_base makes before an upper-case letter, the leading
// character each may take), takes each word's cost from the running sums, and looks each
// word up by its hash, read from the text in place, the buckets of a segment's words fetched
// ahead. The sum of all costs, less each word's costs, plus each word's price, is the walk's
// total: the same numbers, so the same estimates.

inline std::uint8_t scan_info(char32_t cp, const ScanTables& t) noexcept {
  if (cp < kClassLimit) return t.info[cp];
  return cp < 0x323B0 ? static_cast<std::uint8_t>(kClassLetterOther | kScanLetter | kScanFloor)
                      : static_cast<std::uint8_t>(kClassOther | kScanFloor | kScanAttach);
}

// What the scan reads of a family's tables for code points past 255.
struct WideTables {
  const std::uint32_t* entries;
  const std::uint16_t* blocks;
  unsigned shift;  // 32 - pair_bits
  std::uint32_t one;
  explicit WideTables(const EstimatorParams& p)
      : entries(p.pair_entries.data()), blocks(p.block_costs.data()), shift(32 - p.pair_bits), one(p.words.cost) {}
};

// The cost of `cp` after `prev` (one of them past 255; `info`: cp's) as the walk adjusts it:
// the pair's cost (pair_slot, cost), at least two word prices for a code point that is no
// token by itself and one for a control character or a repeated code point, one word price
// for an ASCII digit (the first of its group: the code point before is no digit).
inline std::uint32_t wide_cost(char32_t prev, char32_t cp, std::uint8_t info, const WideTables& t) noexcept {
  const std::uint32_t g = (static_cast<std::uint32_t>(prev) * 0x9E3779B1u) ^ static_cast<std::uint32_t>(cp);
  const std::uint32_t e = t.entries[(g * 0x85EBCA77u) >> t.shift];
  const std::uint32_t tag = (g ^ (g >> 16)) & 0xFFFFu;
  const std::uint32_t block = t.blocks[block_of(cp)];
  // Selects, not branches (every outcome here depends on the text): both costs are read.
  // The entry counts when its tag is the pair's and its cost is not kUnseenPair.
  std::uint32_t c = (e ^ (tag << 16)) < kUnseenPair ? e & 0xFFFFu : block;
  const std::uint32_t once = (info & kScanControl) != 0 || cp == prev ? t.one : 0;
  const std::uint32_t least = (info & kScanFloor) != 0 ? 2 * t.one : once;
  c = c < least ? least : c;
  return (info & kScanDigit) != 0 ? t.one : c;
}

constexpr std::size_t kMaskWords = kScanSegment / 64;
static_assert(kClassSpace == 7 && kClassUpper == 2 && kClassLower == 1 && kScanClassMask == 7,
              "masks_from_info reads the classes by their bits");
// Texts shorter than this are walked (the same numbers): on them the scan's fixed cost is
// more than the walk's whole cost.
constexpr std::size_t kScanMinimum = 16;
static_assert(kScanFloor == 1u << 3 && kScanLetter == 1u << 4 && kScanControl == 1u << 5 && kScanAttach == 1u << 6 &&
                  kScanDigit == 1u << 7,
              "wide_cost and masks_from_info read the flags by their bit positions");

// One segment's costs and class masks.
struct Segment {
  // pbuf[i + 1]: the costs of the segment's code points [0, i), for i in [-1, m]; pbuf[0]
  // is minus the cost of the code point before the segment, so that it reads as that
  // code point's cost when subtracted.
  std::uint32_t pbuf[kScanSegment + 2];
  std::uint64_t letter[kMaskWords], attach[kMaskWords], space[kMaskWords], digit[kMaskWords];
  std::uint64_t upper[kMaskWords], lower[kMaskWords], other[kMaskWords];  // letters: Lu/Lt, Ll, the rest
};

// The class masks of 16 code points (bit i: code point i).
struct Masks16 {
  std::uint32_t letter, attach, space, digit, upper, lower;
};

template <bool O200k>
inline void store_masks(Segment& s, std::size_t j, const Masks16& k) noexcept {
  const std::size_t q = j >> 6;
  const unsigned shift = j & 63;
  s.letter[q] |= std::uint64_t{k.letter} << shift;
  s.attach[q] |= std::uint64_t{k.attach} << shift;
  s.space[q] |= std::uint64_t{k.space} << shift;
  s.digit[q] |= std::uint64_t{k.digit} << shift;
  if constexpr (O200k) {
    s.upper[q] |= std::uint64_t{k.upper} << shift;
    s.lower[q] |= std::uint64_t{k.lower} << shift;
    s.other[q] |= std::uint64_t{k.letter & ~(k.upper | k.lower)} << shift;
  }
}

// The masks of 16 code points from their info bytes.
inline Masks16 masks_from_info(const std::uint8_t* info) noexcept {
  Masks16 k{};
#if defined(CTXCORE_SSE2)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(info));
  // Each flag moved to its byte's top bit, where movemask reads it.
  k.letter = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_slli_epi16(v, 3)));  // kScanLetter
  k.attach = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_slli_epi16(v, 1)));  // kScanAttach
  k.digit = static_cast<std::uint32_t>(_mm_movemask_epi8(v));                      // kScanDigit
  const __m128i cls = _mm_and_si128(v, _mm_set1_epi8(kScanClassMask));
  k.space = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(cls, _mm_set1_epi8(kClassSpace))));
  k.upper = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(cls, _mm_set1_epi8(kClassUpper))));
  k.lower = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(cls, _mm_set1_epi8(kClassLower))));
#else
  // Eight bytes at a time: each flag moved to its byte's low bit, the low bits gathered
  // into one byte by a product.
  constexpr std::uint64_t kLow = 0x0101010101010101ull;
  const auto gather = [](std::uint64_t m) { return static_cast<std::uint32_t>((m * 0x0102040810204080ull) >> 56); };
  for (unsigned half = 0; half < 2; ++half) {
    const std::uint64_t x = load64(info + 8 * half);
    const std::uint64_t c0 = x & kLow, c1 = (x >> 1) & kLow, c2 = (x >> 2) & kLow;  // the class's bits
    const unsigned at = 8 * half;
    k.letter |= gather((x >> 4) & kLow) << at;       // kScanLetter
    k.attach |= gather((x >> 6) & kLow) << at;       // kScanAttach
    k.digit |= gather((x >> 7) & kLow) << at;        // kScanDigit
    k.space |= gather(c0 & c1 & c2) << at;           // kClassSpace: 7
    k.upper |= gather(~c0 & c1 & ~c2 & kLow) << at;  // kClassUpper: 2
    k.lower |= gather(c0 & ~c1 & ~c2 & kLow) << at;  // kClassLower: 1
  }
#endif
  return k;
}

// The masks of 16 code points below 256, b[0 .. 16), of which the first `rem` are the text's
// (the rest are 0, whose info byte is 0: no flag but the class Other).
inline Masks16 classify_bytes(const std::uint8_t* b, const ScanTables& t) noexcept {
#if defined(CTXCORE_SSE2)
  if (t.ascii_standard) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    if (_mm_movemask_epi8(v) == 0) {
      const auto range = [&v](int from, int count) {  // from <= v < from + count, as a mask
        const __m128i x = _mm_add_epi8(v, _mm_set1_epi8(static_cast<char>(0x80 - from)));
        return static_cast<std::uint32_t>(
            _mm_movemask_epi8(_mm_cmplt_epi8(x, _mm_set1_epi8(static_cast<char>(-128 + count)))));
      };
      const __m128i nl = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\r')));
      const __m128i sp = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(t.spaces[0]))),
                                                   _mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(t.spaces[1])))),
                                      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(t.spaces[2]))),
                                                   _mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(t.spaces[3])))));
      Masks16 k;
      k.lower = range('a', 26);
      k.upper = range('A', 26);
      k.digit = range('0', 10);
      k.letter = k.lower | k.upper;
      k.space = static_cast<std::uint32_t>(_mm_movemask_epi8(sp));
      k.attach = ~(k.letter | k.digit | static_cast<std::uint32_t>(_mm_movemask_epi8(nl))) & 0xFFFFu;
      return k;
    }
  }
#endif
  std::uint8_t info[16];
  for (unsigned i = 0; i < 16; ++i) info[i] = t.info[b[i]];
  return masks_from_info(info);
}

// Whether the 16 code points at u are all below 256; if so, writes them to out[0 .. 16).
template <class Unit>
inline bool narrow16(const Unit* u, std::uint8_t* out) noexcept {
#if defined(CTXCORE_SSE2)
  const __m128i zero = _mm_setzero_si128();
  if constexpr (sizeof(Unit) == 2) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 8));
    const __m128i high = _mm_srli_epi16(_mm_or_si128(a, b), 8);
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(high, zero)) != 0xFFFF) return false;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(a, b));
    return true;
  } else {
    const auto* v = reinterpret_cast<const __m128i*>(u);
    const __m128i a = _mm_loadu_si128(v), b = _mm_loadu_si128(v + 1), c = _mm_loadu_si128(v + 2),
                  d = _mm_loadu_si128(v + 3);
    const __m128i all = _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d));
    const __m128i high = _mm_and_si128(all, _mm_set1_epi32(static_cast<int>(0xFFFFFF00u)));
    if (_mm_movemask_epi8(_mm_cmpeq_epi32(high, zero)) != 0xFFFF) return false;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
    return true;
  }
#else
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < 16; ++i) top |= static_cast<std::uint32_t>(u[i]);
  if (top >= 256) return false;
  for (std::size_t i = 0; i < 16; ++i) out[i] = static_cast<std::uint8_t>(u[i]);
  return true;
#endif
}

// The pair (p[-1], p[0]) as the index (p[0] << 8) | p[-1].
inline std::uint32_t pair_at(const std::uint8_t* p) noexcept {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return static_cast<std::uint32_t>(p[-1]) | (static_cast<std::uint32_t>(p[0]) << 8);
#else
  std::uint16_t v;
  std::memcpy(&v, p - 1, 2);
  return v;
#endif
}

// The splits o200k_base makes in a mask word's letters: each upper-case letter whose nearest
// upper- or lower-case letter before it in its run is lower-case. `low` holds whether that is
// so at the position before the mask word, and is updated to the mask word's last position.
inline std::uint64_t case_splits(std::uint64_t letter, std::uint64_t upper, std::uint64_t lower, std::uint64_t other,
                                 bool& low) noexcept {
  if (other == 0) {
    // Every letter is upper- or lower-case: the nearest one is the letter just before.
    const std::uint64_t splits = upper & ((lower << 1) | std::uint64_t{low});
    low = (lower >> 63) != 0;
    return splits;
  }
  // Other letters (marks, letters without case) pass the state on.
  std::uint64_t splits = 0;
  bool st = low;
  for (std::uint64_t events = upper | lower | ~letter; events != 0; events &= events - 1) {
    const unsigned i = ctz64(events);
    const std::uint64_t bit = std::uint64_t{1} << i;
    if (upper & bit) {
      splits |= st ? bit : 0;
      st = false;
    } else {
      st = (lower & bit) != 0;
    }
  }
  low = st;
  return splits;
}

// The hash of a word of `len` <= 16 canonical bytes given as its two 8-byte words (as
// hash_bytes takes it).
inline std::uint64_t hash16(std::uint64_t w0, std::uint64_t w1, std::size_t len, unsigned width) noexcept {
  return mix(w0 ^ kHash1, w1 ^ kHash2 ^ (len | (std::uint64_t{width} << 16)));
}

// w[len]: the masks that keep the first len of 16 bytes (as two 8-byte words).
struct Keep16 {
  std::uint64_t w[17][2];
  constexpr Keep16() : w() {
    for (std::size_t n = 0; n <= 16; ++n) {
      w[n][0] = n >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * n)) - 1;
      w[n][1] = n >= 16 ? ~std::uint64_t{0} : n <= 8 ? 0 : (std::uint64_t{1} << (8 * (n - 8))) - 1;
    }
  }
};
constexpr Keep16 kKeep{};

// The hash of the word [start, start + len) of a text of n code points (word_hash, read in
// place where it can be).
template <class Unit>
inline std::uint64_t text_word_hash(const Unit* cps, std::size_t n, std::size_t start, std::size_t len) noexcept {
  if constexpr (sizeof(Unit) == 1) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(cps);
    if (len <= 16 && n - start >= 16) {  // the 16 bytes from the word's start are the text's
      return hash16(load64(b + start) & kKeep.w[len][0], load64(b + start + 8) & kKeep.w[len][1], len, 1);
    }
    return hash_bytes(b + start, len, 1, b, b + n);
  } else {
#if defined(CTXCORE_SSE2)
    if constexpr (sizeof(Unit) == 2) {
      if (len <= 16 && n - start >= 16) {
        // The units, those past the word cleared; their high bytes zero: the bytes.
        const auto* v = reinterpret_cast<const __m128i*>(cps + start);
        const __m128i keep0 = _mm_set_epi64x(static_cast<long long>(kKeep.w[2 * std::min<std::size_t>(len, 8)][1]),
                                             static_cast<long long>(kKeep.w[2 * std::min<std::size_t>(len, 8)][0]));
        const std::size_t rest = len > 8 ? len - 8 : 0;
        const __m128i keep1 =
            _mm_set_epi64x(static_cast<long long>(kKeep.w[2 * rest][1]), static_cast<long long>(kKeep.w[2 * rest][0]));
        const __m128i a = _mm_and_si128(_mm_loadu_si128(v), keep0);
        const __m128i b = _mm_and_si128(_mm_loadu_si128(v + 1), keep1);
        const __m128i high = _mm_srli_epi16(_mm_or_si128(a, b), 8);
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(high, _mm_setzero_si128())) == 0xFFFF) {
          const __m128i bytes = _mm_packus_epi16(a, b);
          alignas(16) std::uint64_t w[2];
          _mm_store_si128(reinterpret_cast<__m128i*>(w), bytes);
          return hash16(w[0], w[1], len, 1);
        }
        if (len <= 8) {
          alignas(16) std::uint64_t w[2];
          _mm_store_si128(reinterpret_cast<__m128i*>(w), a);
          return hash16(w[0], w[1], 2 * len, 2);
        }
        // Past 8 units with one past 255: the units are the canonical bytes.
        const auto* text = reinterpret_cast<const std::uint8_t*>(cps);
        return hash_bytes(text + 2 * start, 2 * len, 2, text, text + 2 * n);
      }
    }
#elif !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
    if constexpr (sizeof(Unit) == 2) {
      if (len <= 16 && n - start >= 16) {
        // The same without SSE2: four units to an 8-byte word, those past the word cleared.
        const auto* text = reinterpret_cast<const std::uint8_t*>(cps + start);
        std::uint64_t u[4];
        for (std::size_t i = 0; i < 4; ++i) {
          const std::size_t from = 8 * i;
          u[i] = from >= 2 * len ? 0 : load64(text + from) & kKeep.w[std::min<std::size_t>(2 * len - from, 16)][0];
        }
        if (((u[0] | u[1] | u[2] | u[3]) & 0xFF00FF00FF00FF00ull) == 0) {
          // Each unit's low byte, four to 32 bits.
          const auto pack = [](std::uint64_t x) {
            x = (x | (x >> 8)) & 0x0000FFFF0000FFFFull;
            return (x | (x >> 16)) & 0xFFFFFFFFull;
          };
          return hash16(pack(u[0]) | (pack(u[1]) << 32), pack(u[2]) | (pack(u[3]) << 32), len, 1);
        }
        if (len <= 8) return hash16(u[0], u[1], 2 * len, 2);
        return hash_bytes(text, 2 * len, 2, reinterpret_cast<const std::uint8_t*>(cps),
                          reinterpret_cast<const std::uint8_t*>(cps + n));
      }
    }
#endif
    return word_hash(cps + start, len);
  }
}

template <class Unit>
#if defined(__GNUC__)
__attribute__((noinline))
#endif
std::uint32_t wide_block(const Unit* u, std::size_t rem, char32_t prev, const ScanTables& t, const WideTables& wide,
                         std::uint32_t acc, std::uint32_t* sums, std::uint8_t* info) noexcept {
  // Everything in locals: the stores below could otherwise alias the tables' pointers.
  const std::uint16_t* const pairs = t.pairs.data();
  const std::uint8_t* const infos = t.info.data();
  const WideTables w = wide;
  std::uint8_t flags[16];
  std::uint32_t costs[16];
  for (std::size_t i = 0; i < rem; ++i) {
    const auto cp = static_cast<char32_t>(u[i]);
    const std::uint8_t k = cp < kClassLimit ? infos[cp] : scan_info(cp, t);
    flags[i] = k;
    // Both costs, then a select: in such a block either kind of pair follows the other.
    const std::uint32_t narrow_cost = pairs[((static_cast<std::size_t>(cp) & 0xFF) << 8) | (prev & 0xFF)];
    const std::uint32_t wide_pair = 0u - static_cast<std::uint32_t>((prev | cp) >= 256);
    costs[i] = (narrow_cost & ~wide_pair) | (wide_cost(prev, cp, k, w) & wide_pair);
    prev = cp;
  }
  for (std::size_t i = 0; i < rem; ++i) {
    acc += costs[i];
    sums[i] = acc;
  }
  std::memcpy(info, flags, rem);
  return acc;
}

#if defined(CTXCORE_AVX2)
// Lanes of v with `bit` set.
__attribute__((target("avx2"))) inline __m256i flag(__m256i v, int bit) noexcept {
  return _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(bit)), _mm256_set1_epi32(bit));
}

// wide_block for 16 code points of a UCS-2 text, eight at a time: the class bytes and the
// costs of both kinds of pair read by gathers (the tables have room for their 4-byte reads),
// the selects by masks, the running sums by shifts.
__attribute__((target("avx2"))) std::uint32_t wide_block_avx2(const std::uint16_t* u, char32_t prev,
                                                              const ScanTables& t, const WideTables& w,
                                                              std::uint32_t acc, std::uint32_t* sums,
                                                              std::uint8_t* info) noexcept {
  const auto* infos = reinterpret_cast<const int*>(t.info.data());
  const auto* pairs = reinterpret_cast<const int*>(t.pairs.data());
  const auto* entries = reinterpret_cast<const int*>(w.entries);
  const auto* blocks = reinterpret_cast<const int*>(w.blocks);
  const __m256i low8 = _mm256_set1_epi32(0xFF), low16 = _mm256_set1_epi32(0xFFFF);
  const __m256i one = _mm256_set1_epi32(static_cast<int>(w.one)), two = _mm256_set1_epi32(static_cast<int>(2 * w.one));
  const __m256i up_one = _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6);
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(w.shift));
  __m256i k[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i cp = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 8 * h)));
    // The code point before each: the lanes moved up one, `prev` into the first.
    const __m256i before =
        _mm256_blend_epi32(_mm256_permutevar8x32_epi32(cp, up_one), _mm256_set1_epi32(static_cast<int>(prev)), 0x01);
    const __m256i inf = _mm256_and_si256(_mm256_i32gather_epi32(infos, cp, 1), low8);
    const __m256i pair =
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(cp, low8), 8), _mm256_and_si256(before, low8));
    const __m256i narrow = _mm256_and_si256(_mm256_i32gather_epi32(pairs, pair, 2), low16);
    // pair_slot and cost.
    const __m256i g =
        _mm256_xor_si256(_mm256_mullo_epi32(before, _mm256_set1_epi32(static_cast<int>(0x9E3779B1u))), cp);
    const __m256i slot =
        _mm256_srl_epi32(_mm256_mullo_epi32(g, _mm256_set1_epi32(static_cast<int>(0x85EBCA77u))), shift);
    const __m256i e = _mm256_i32gather_epi32(entries, slot, 4);
    const __m256i tag = _mm256_and_si256(_mm256_xor_si256(g, _mm256_srli_epi32(g, 16)), low16);
    const __m256i block =
        _mm256_and_si256(_mm256_i32gather_epi32(blocks, _mm256_srli_epi32(cp, kBlockShift), 2), low16);
    const __m256i x = _mm256_xor_si256(e, _mm256_slli_epi32(tag, 16));
    const __m256i seen = _mm256_cmpeq_epi32(_mm256_min_epu32(x, _mm256_set1_epi32(kUnseenPair - 1)), x);
    __m256i c = _mm256_blendv_epi8(block, _mm256_and_si256(e, low16), seen);
    __m256i least = _mm256_and_si256(_mm256_or_si256(flag(inf, kScanControl), _mm256_cmpeq_epi32(cp, before)), one);
    least = _mm256_blendv_epi8(least, two, flag(inf, kScanFloor));
    c = _mm256_blendv_epi8(_mm256_max_epu32(c, least), one, flag(inf, kScanDigit));
    const __m256i wide = _mm256_cmpgt_epi32(_mm256_or_si256(cp, before), _mm256_set1_epi32(255));
    c = _mm256_blendv_epi8(narrow, c, wide);
    // Running sums.
    c = _mm256_add_epi32(c, _mm256_slli_si256(c, 4));
    c = _mm256_add_epi32(c, _mm256_slli_si256(c, 8));
    c = _mm256_add_epi32(
        c, _mm256_blend_epi32(_mm256_setzero_si256(), _mm256_permutevar8x32_epi32(c, _mm256_set1_epi32(3)), 0xF0));
    c = _mm256_add_epi32(c, _mm256_set1_epi32(static_cast<int>(acc)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + 8 * h), c);
    acc = static_cast<std::uint32_t>(_mm256_extract_epi32(c, 7));
    k[h] = inf;
    prev = u[8 * h + 7];
  }
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(k[0], k[1]), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(info),
                   _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
  return acc;
}
#endif

template <class Unit, bool O200k>
RawCost scan(const Unit* cps, std::size_t n, const EstimatorParams& p) noexcept {
  constexpr std::size_t kSeg = kScanSegment;
  const WordModel& w = p.words;
  const ScanTables& t = p.scan;
  const std::uint64_t one = w.cost;
  const std::uint64_t floor = 2 * one;
  const std::size_t max_word = w.max_word;
  const std::uint16_t* pairs = t.pairs.data();
  const std::uint8_t* infos = t.info.data();
  const WideTables wide(p);
  const WordBucket* const table = w.words.buckets.data();
  const std::size_t table_mask = w.words.buckets.size() - 1;
  Segment s;
  // Room for the last mask word's four-at-a-time writes past the count.
  std::uint32_t starts[kSeg + 8], ends[kSeg + 8];
  std::uint64_t hashes[kSeg + 1];
  std::uint32_t better[kSeg + 1], word_price[kSeg + 1];

  std::uint64_t total = 0;  // every code point's cost, then per word its price less its costs
  std::uint64_t sure = 0;
  char32_t prev = 0;
  std::uint64_t c_last = 0;  // the cost of the code point before the segment
  std::size_t digits = 0;    // ASCII digits in a row before the mask word
  // Mask bits of the position before the mask word.
  std::uint64_t c_letter = 0, c_attach = 0, c_lead = 0;
  std::uint64_t tail_lead = 0;  // the lead bit of the segment's last code point
  bool low = false;
  // The word read at the end of the segment, which may run on into the next.
  bool open = false;
  std::size_t open_start = 0;
  std::uint64_t open_run = 0, open_leadc = 0;

  const auto price = [&](std::uint64_t run, std::uint64_t leadc, bool found) {
    const std::uint64_t yes = std::max(one, leadc);
    const std::uint64_t no = std::max(run, floor);
    const std::uint64_t v = found ? yes : no;
    total += v - run;
    sure += found ? v : 0;
  };

  for (std::size_t a = 0; a < n; a += kSeg) {
    const std::size_t m = std::min(kSeg, n - a);
    const std::size_t words = (m + 63) / 64;
    for (std::size_t q = 0; q < words; ++q) {
      s.letter[q] = s.attach[q] = s.space[q] = s.digit[q] = 0;
      if constexpr (O200k) s.upper[q] = s.lower[q] = s.other[q] = 0;
    }
    std::uint32_t* P = s.pbuf + 1;
    P[-1] = static_cast<std::uint32_t>(0 - c_last);
    P[0] = 0;
    // Pass 1: costs and classes, 16 code points at a time.
    for (std::size_t j = 0; j < m; j += 16) {
      const std::size_t rem = std::min<std::size_t>(16, m - j);
      const Unit* u = cps + a + j;
      std::uint8_t tmp[17 + 16];
      const std::uint8_t* b = nullptr;  // the block as bytes, b[-1] the byte before
      bool first_wide = false;          // the code point before is past 255
      if constexpr (sizeof(Unit) == 1) {
        if (rem == 16 && a + j > 0) {
          b = reinterpret_cast<const std::uint8_t*>(u);
        } else {
          tmp[0] = static_cast<std::uint8_t>(prev);
          std::memset(tmp + 1, 0, 16);
          std::memcpy(tmp + 1, u, rem);
          b = tmp + 1;
        }
      } else {
        bool narrow;
        if (rem == 16) {
          narrow = narrow16(u, tmp + 1);
        } else {
          std::uint32_t top = 0;
          std::memset(tmp + 1, 0, 16);
          for (std::size_t i = 0; i < rem; ++i) {
            top |= static_cast<std::uint32_t>(u[i]);
            tmp[1 + i] = static_cast<std::uint8_t>(u[i]);
          }
          narrow = top < 256;
        }
        if (narrow) {
          tmp[0] = static_cast<std::uint8_t>(prev);
          first_wide = prev >= 256;
          b = tmp + 1;
        }
      }
      std::uint32_t acc = P[j];
      if (b != nullptr) {
        store_masks<O200k>(s, j, classify_bytes(b, t));
        std::size_t i = 0;
        if (first_wide) {
          acc += wide_cost(prev, b[0], infos[b[0]], wide);
          P[j + 1] = acc;
          i = 1;
        }
        if (rem == 16 && i == 0) {
          for (std::size_t k = 0; k < 16; ++k) {
            acc += pairs[pair_at(b + k)];
            P[j + k + 1] = acc;
          }
        } else {
          for (; i < rem; ++i) {
            acc += pairs[pair_at(b + i)];
            P[j + i + 1] = acc;
          }
        }
        prev = b[rem - 1];
      } else {
        alignas(16) std::uint8_t info[16] = {};
#if defined(CTXCORE_AVX2)
        if (sizeof(Unit) == 2 && rem == 16 && t.avx2) {
          acc = wide_block_avx2(reinterpret_cast<const std::uint16_t*>(u), prev, t, wide, acc, P + j + 1, info);
        } else {
          acc = wide_block(u, rem, prev, t, wide, acc, P + j + 1, info);
        }
#else
        acc = wide_block(u, rem, prev, t, wide, acc, P + j + 1, info);
#endif
        prev = static_cast<char32_t>(u[rem - 1]);
        store_masks<O200k>(s, j, masks_from_info(info));
      }
    }
    total += P[m];
    // Digits: the table charges the first of a run; every third one after it starts a group.
    for (std::size_t q = 0; q < words; ++q) {
      const std::uint64_t d = s.digit[q];
      if (d == 0) {
        digits = 0;
        continue;
      }
      if (digits > 0 && (d & 1u)) {
        // A run that goes on from the mask word before: counted one digit at a time.
        std::size_t r = digits;
        for (unsigned i = 0; i < 64; ++i) {
          if ((d >> i) & 1u) {
            if (r >= 3 && r % 3 == 0) total += one;
            ++r;
          } else {
            r = 0;
          }
        }
      } else {
        // The digits with at least 3k digits before them in their run, k = 1, 2, ...: the
        // first of each run of those starts a group.
        for (std::uint64_t g = d & (d << 1) & (d << 2) & (d << 3); g != 0; g &= g << 3) {
          for (std::uint64_t first = g & ~(g << 1); first != 0; first &= first - 1) total += one;
        }
      }
      // The digits in a row at the top of the mask word.
      digits = d == ~std::uint64_t{0} ? digits + 64 : clz64(~d);
    }
    // Pass 2: the words, from the masks. Their starts and ends are listed first (four at a
    // time whatever their number, so that no branch waits on it); then each word, in order,
    // is priced as if not found and its hash taken, its bucket fetched ahead; then the
    // probes, which turn the found words' prices into the word price.
    std::size_t ns = 0, ne = 0;
    for (std::size_t q = 0; q < words; ++q) {
      const std::uint64_t valid = (q + 1) * 64 <= m ? ~std::uint64_t{0} : (std::uint64_t{1} << (m & 63)) - 1;
      const std::uint64_t L = s.letter[q], A = s.attach[q];
      const std::uint64_t before = (L << 1) | c_letter;
      const std::uint64_t run_start = L & ~before;
      std::uint64_t finish = ~L & before & valid;
      const std::uint64_t lead_ok = A & (s.space[q] | ~((A << 1) | c_attach));
      std::uint64_t begin = run_start;
      if constexpr (O200k) {
        const std::uint64_t splits = case_splits(L, s.upper[q], s.lower[q], s.other[q], low);
        begin |= splits;
        finish |= splits;
      }
      const std::uint64_t leads = run_start & ((lead_ok << 1) | c_lead);
      c_letter = L >> 63;
      c_attach = A >> 63;
      c_lead = lead_ok >> 63;
      if (q + 1 == words) tail_lead = (lead_ok >> ((m - 1) & 63)) & 1u;
      const auto base = static_cast<std::uint32_t>(q * 64 + 1);
      // starts[k]: the word's first code point (its leading character included) + 1, bit 31
      // set when it has a leading character; ends[k]: its end + 1.
      const unsigned nb = popcount64(begin);
      for (unsigned k = 0;; k += 4) {
        for (unsigned i = 0; i < 4; ++i) {
          const unsigned at = ctz64(begin | (std::uint64_t{1} << 63));
          const auto lead = static_cast<std::uint32_t>(leads >> at) & 1u;
          starts[ns + k + i] = ((base + at) - lead) | (lead << 31);
          begin &= begin - 1;
        }
        if (k + 4 >= nb) break;
      }
      ns += nb;
      const unsigned nf = popcount64(finish);
      for (unsigned k = 0;; k += 4) {
        for (unsigned i = 0; i < 4; ++i) {
          ends[ne + k + i] = base + ctz64(finish | (std::uint64_t{1} << 63));
          finish &= finish - 1;
        }
        if (k + 4 >= nf) break;
      }
      ne += nf;
    }
    // pb[i + 1] is P[i], so a start of -1 (a leading character that ends the segment
    // before) reads as 0. A word still open from the segment before ends first.
    const std::uint32_t* pb = s.pbuf;
    std::size_t e0 = 0;
    if (open && ne > 0) {
      const std::size_t len = a + ends[0] - 1 - open_start;
      price(open_run + pb[ends[0]], open_leadc,
            len <= max_word && contains(w.words, text_word_hash(cps, n, open_start, len)));
      open = false;
      e0 = 1;
    }
    if (open) open_run += P[m];  // no word ends in the segment
    const std::size_t closed = std::min(ns, ne - e0);
    std::size_t np = 0;  // words to look up
    for (std::size_t k = 0; k < closed; ++k) {
      const std::uint32_t sk = starts[k] & 0x7FFFFFFFu;
      const std::uint32_t lead = starts[k] >> 31;
      const std::uint32_t ek = ends[k + e0];
      const std::uint32_t len = ek - sk;
      const std::uint64_t run = pb[ek] - pb[sk];
      const std::uint64_t leadc = (pb[sk + 1] - pb[sk]) & (0u - lead);
      const std::uint64_t no = std::max(run, floor);
      const std::uint64_t yes = std::max(one, leadc);
      total += no - run;
      // A word longer than any vocabulary word is not looked up.
      if (len > max_word) continue;
      const std::uint64_t h = text_word_hash(cps, n, a + sk - 1, len);
      hashes[np] = h;
      better[np] = static_cast<std::uint32_t>(no - yes);
      word_price[np] = static_cast<std::uint32_t>(yes);
      ++np;
      prefetch(table + (static_cast<std::size_t>(h >> 32) & table_mask));
    }
    if (ns > closed) {  // the last word, still open at the segment's end
      const std::uint32_t sk = starts[closed] & 0x7FFFFFFFu;
      open = true;
      open_start = a + sk - 1;
      open_run = pb[m + 1] - pb[sk];
      open_leadc = (starts[closed] >> 31) ? pb[sk + 1] - pb[sk] : 0;
    }
    for (std::size_t j = 0; j < np; ++j) {
      const std::uint64_t found = 0 - static_cast<std::uint64_t>(probe(w.words, table, table_mask, hashes[j]));
      total -= better[j] & found;
      sure += word_price[j] & found;
    }
    c_last = P[m] - P[m - 1];
  }
  if (open) {
    // The text's last word: priced as a word while it is a vocabulary word or a prefix of one.
    const std::size_t len = n - open_start;
    bool found = false;
    if (len <= max_word) {
      const std::uint64_t h = text_word_hash(cps, n, open_start, len);
      found = contains(w.words, h) || contains(w.prefixes, h);
    }
    price(open_run, open_leadc, found);
  } else if (n > 0 && tail_lead != 0) {
    // As the walk ends: a character that a following letter would take into its word ends
    // the text.
    sure += c_last;
  }
  return RawCost{total, sure};
}

}  // namespace

void set_words(EstimatorParams& params, unsigned mode, std::vector<std::uint8_t> classes, std::string_view words_utf8,
               std::uint32_t cost) {
  if (mode != kNoWords && mode != kWordsCl100k && mode != kWordsO200k)
    throw std::invalid_argument("estimator word mode must be 0, 1 or 2, got " + std::to_string(mode));
  WordModel w;
  w.mode = mode;
  if (mode == kNoWords) {
    params.words = std::move(w);
    return;
  }
  if (classes.size() != kClassLimit)
    throw std::invalid_argument("estimator char classes must have " + std::to_string(kClassLimit) + " entries, got " +
                                std::to_string(classes.size()));
  for (std::size_t i = 0; i < classes.size(); ++i) {
    if (classes[i] >= kClassCount)
      throw std::invalid_argument("estimator char class of U+" + std::to_string(i) + " must be < " +
                                  std::to_string(kClassCount) + ", got " + std::to_string(classes[i]));
  }
  if (cost > 64u * static_cast<std::uint32_t>(kCostUnit))
    throw std::invalid_argument("estimator word cost must be at most 64 tokens, got " + std::to_string(cost) +
                                " units");
  w.classes = std::move(classes);
  w.cost = cost;
  std::vector<std::uint64_t> hashes, prefixes;
  std::vector<char32_t> single;
  std::vector<char32_t> cps;
  std::size_t count = 0;
  w.run_max.assign(128, 0);
  std::size_t pos = 0;
  while (pos < words_utf8.size()) {
    std::size_t end = words_utf8.find('\0', pos);
    if (end == std::string_view::npos) end = words_utf8.size();
    const std::string_view word = words_utf8.substr(pos, end - pos);
    if (word.empty()) throw std::invalid_argument("estimator word " + std::to_string(count) + " is empty");
    cps.clear();
    for (std::size_t i = 0; i < word.size();) {
      char32_t cp = 0;
      const std::size_t len = decode(word, i, cp);
      if (len == 0) throw std::invalid_argument("estimator word " + std::to_string(count) + " is not valid UTF-8");
      cps.push_back(cp);
      i += len;
    }
    if (cps.size() > kMaxWordCodePoints)
      throw std::invalid_argument("estimator word " + std::to_string(count) + " is longer than " +
                                  std::to_string(kMaxWordCodePoints) + " code points");
    w.max_word = std::max(w.max_word, cps.size());
    if (cps.size() == 1 && cps[0] < kClassLimit) single.push_back(cps[0]);
    const auto first = static_cast<unsigned char>(word[0]);
    if (first < 0x80 && word.find_first_not_of(word[0]) == std::string_view::npos)
      w.run_max[first] =
          static_cast<std::uint8_t>(std::min<std::size_t>(std::max<std::size_t>(w.run_max[first], cps.size()), 255));
    hashes.push_back(word_hash(cps.data(), cps.size()));
    for (std::size_t k = 1; k < cps.size(); ++k) prefixes.push_back(word_hash(cps.data(), k));
    ++count;
    pos = end + 1;
  }
  // The words: half full buckets, so that a probe rarely reads two. Their prefixes (those
  // that are no word themselves: the last word is looked up in both), looked up once a
  // text: fuller buckets, in less memory.
  std::sort(hashes.begin(), hashes.end());
  std::sort(prefixes.begin(), prefixes.end());
  prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
  std::vector<std::uint64_t> proper;
  std::set_difference(prefixes.begin(), prefixes.end(), hashes.begin(), hashes.end(), std::back_inserter(proper));
  build_set(w.words, hashes, 4);
  build_set(w.prefixes, proper, 7);
  w.single.assign(kClassLimit / 64, 0);
  for (const char32_t cp : single) w.single[cp >> 6] |= std::uint64_t{1} << (cp & 63);
  params.words = std::move(w);
}

void validate(const EstimatorParams& p) {
  if (p.pair_bits < kMinPairBits || p.pair_bits > kMaxPairBits)
    throw std::invalid_argument("estimator pair_bits must be in [" + std::to_string(kMinPairBits) + ", " +
                                std::to_string(kMaxPairBits) + "], got " + std::to_string(p.pair_bits));
  if (p.latin_costs.size() != kLatinPairs)
    throw std::invalid_argument("estimator latin_costs must have " + std::to_string(kLatinPairs) + " entries, got " +
                                std::to_string(p.latin_costs.size()));
  const std::size_t want = std::size_t{1} << p.pair_bits;
  if (p.pair_entries.size() != want)
    throw std::invalid_argument("estimator pair_entries must have 2**pair_bits = " + std::to_string(want) +
                                " entries, got " + std::to_string(p.pair_entries.size()));
  if (p.block_costs.size() != kBlocks)
    throw std::invalid_argument("estimator block_costs must have " + std::to_string(kBlocks) + " entries, got " +
                                std::to_string(p.block_costs.size()));
  for (std::size_t i = 0; i < kBlocks; ++i) {
    if (p.block_costs[i] == kUnseenPair)
      throw std::invalid_argument("estimator block_costs[" + std::to_string(i) + "] must be < " +
                                  std::to_string(kUnseenPair));
  }
  if (!std::isfinite(p.scale) || p.scale < 0.0)
    throw std::invalid_argument("estimator scale must be finite and >= 0, got " + std::to_string(p.scale));
  if (!std::isfinite(p.spread) || p.spread < 0.0)
    throw std::invalid_argument("estimator spread must be finite and >= 0, got " + std::to_string(p.spread));
  if (!std::isfinite(p.word_scale) || p.word_scale < 0.0)
    throw std::invalid_argument("estimator word_scale must be finite and >= 0, got " + std::to_string(p.word_scale));
  // What is sure is never priced above what is estimated: else a text growing a word out
  // of estimated characters could lower its estimate.
  if (p.word_scale > p.scale)
    throw std::invalid_argument("estimator word_scale must be at most scale (" + std::to_string(p.scale) + "), got " +
                                std::to_string(p.word_scale));
  const WordModel& w = p.words;
  if (w.mode != kNoWords) {
    const auto sized = [](const WordSet& set) {
      const std::size_t t = set.buckets.size();
      return t > 0 && (t & (t - 1)) == 0;
    };
    if ((w.mode != kWordsCl100k && w.mode != kWordsO200k) || w.classes.size() != kClassLimit || !sized(w.words) ||
        !sized(w.prefixes) || w.single.size() != kClassLimit / 64 || w.run_max.size() != 128)
      throw std::invalid_argument("estimator word model is malformed: build it with set_words");
  }
}

void prepare(EstimatorParams& params) {
  validate(params);
  ScanTables t;
  const WordModel& w = params.words;
  if (w.mode != kNoWords) {
    const bool o200k = w.mode == kWordsO200k;
    t.info.resize(kClassLimit);
    for (std::size_t cp = 0; cp < kClassLimit; ++cp) {
      const std::uint8_t k = w.classes[cp];
      std::uint8_t info = k;
      if (is_letter(k, o200k)) info |= kScanLetter;
      if (cp >= 0x80 && !((w.single[cp >> 6] >> (cp & 63)) & 1u)) info |= kScanFloor;
      if ((cp < 0x20 || cp == 0x7F) && cp != '\t' && cp != '\n' && cp != '\r') info |= kScanControl;
      if (attachable(k, o200k)) info |= kScanAttach;
      if (cp >= '0' && cp <= '9') info |= kScanDigit;
      t.info[cp] = info;
    }
    // Every adjustment of the walk that depends on the code point and the one before it.
    const std::uint64_t one = w.cost;
    t.pairs.resize(kLatinPairs + 2);  // two spare entries: the wide blocks read 4 bytes at each
    bool fits = true;
    for (char32_t prev = 0; prev < 256; ++prev) {
      for (char32_t cp = 0; cp < 256; ++cp) {
        std::uint64_t c = cost(prev, cp, params);
        if (cp >= '0' && cp <= '9') {
          c = prev >= '0' && prev <= '9' ? 0 : one;
        } else if (cp >= 0x80) {
          if (!((w.single[cp >> 6] >> (cp & 63)) & 1u)) {
            c = std::max(c, 2 * one);
          } else if (cp == prev) {
            c = std::max(c, one);
          }
        } else if ((cp < 0x20 || cp == 0x7F) && cp != '\t' && cp != '\n' && cp != '\r') {
          c = std::max(c, one);
        } else if (cp == prev && w.run_max[cp] != 0) {
          c = std::max<std::uint64_t>(c, one / w.run_max[cp]);
        }
        fits = fits && c <= 0xFFFF;
        t.pairs[(static_cast<std::size_t>(cp) << 8) | prev] = static_cast<std::uint16_t>(c);
      }
    }
    // A word price past 32 tokens: the costs do not fit the table, so texts are walked.
    if (!fits) {
      params.scan = ScanTables{};
      return;
    }
    // The ASCII classes the scan's compares assume: Unicode's, with up to four spaces.
    std::size_t spaces = 0;
    bool standard = true;
    for (char32_t cp = 0; cp < 0x80 && standard; ++cp) {
      const std::uint8_t k = w.classes[cp];
      std::uint8_t want = kClassOther;
      if (cp >= 'a' && cp <= 'z') want = kClassLower;
      if (cp >= 'A' && cp <= 'Z') want = kClassUpper;
      if (cp >= '0' && cp <= '9') want = kClassNumber;
      if (cp == '\n' || cp == '\r') want = kClassNewline;
      if (want == kClassOther && k == kClassSpace && spaces < 4) {
        t.spaces[spaces++] = static_cast<std::uint8_t>(cp);
        continue;
      }
      standard = k == want;
    }
    for (std::size_t i = spaces; i < 4; ++i) t.spaces[i] = spaces > 0 ? t.spaces[0] : 0x80;  // 0x80: never ASCII
    t.ascii_standard = standard;
#if defined(CTXCORE_AVX2)
    __builtin_cpu_init();
    t.avx2 = __builtin_cpu_supports("avx2") != 0;
#endif
  }
  params.scan = std::move(t);
}

template <class Unit>
RawCost raw_cost(const Unit* cps, std::size_t n, const EstimatorParams& params) noexcept {
  if (params.words.mode != kNoWords) {
    if (!params.scan.pairs.empty() && n >= kScanMinimum) {
      return params.words.mode == kWordsO200k ? scan<Unit, true>(cps, n, params) : scan<Unit, false>(cps, n, params);
    }
    return walk(cps, n, params, 0, true, true, NoWords{});
  }
  if constexpr (sizeof(Unit) == 1) {
    // Latin-1 text: every pair is a direct entry, no hashing.
    std::uint64_t total = 0;
    std::size_t prev = 0;
    const std::uint16_t* table = params.latin_costs.data();
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t cp = cps[i];
      const std::uint16_t c = table[(prev << 8) | cp];
      total += c != kUnseenPair ? c : params.block_costs[cp >> kBlockShift];
      prev = cp;
    }
    return RawCost{total, 0};
  }
  std::uint64_t total = 0;
  char32_t prev = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto cp = static_cast<char32_t>(cps[i]);
    total += cost(prev, cp, params);
    prev = cp;
  }
  return RawCost{total, 0};
}

template RawCost raw_cost<std::uint8_t>(const std::uint8_t*, std::size_t, const EstimatorParams&) noexcept;
template RawCost raw_cost<std::uint16_t>(const std::uint16_t*, std::size_t, const EstimatorParams&) noexcept;
template RawCost raw_cost<std::uint32_t>(const std::uint32_t*, std::size_t, const EstimatorParams&) noexcept;
template RawCost raw_cost<char32_t>(const char32_t*, std::size_t, const EstimatorParams&) noexcept;

RawCost raw_cost_utf8(std::string_view utf8, const EstimatorParams& params) {
  if (params.words.mode != kNoWords) {
    std::u32string cps;
    cps.reserve(utf8.size());
    for_each_utf8(utf8, [&](char32_t cp) { cps.push_back(cp); });
    return raw_cost(cps.data(), cps.size(), params);
  }
  std::uint64_t total = 0;
  char32_t prev = 0;
  for_each_utf8(utf8, [&](char32_t cp) {
    total += cost(prev, cp, params);
    prev = cp;
  });
  return RawCost{total, 0};
}

std::int64_t finish_estimate(RawCost raw_cost, bool nonempty, const EstimatorParams& params) noexcept {
  if (!nonempty) return 0;
  const std::uint64_t sure_units = std::min(raw_cost.sure, raw_cost.units);
  const double sure = static_cast<double>(sure_units) / kCostUnit;
  const double rest = static_cast<double>(raw_cost.units - sure_units) / kCostUnit;
  const double est = std::ceil(params.word_scale * sure + params.scale * rest + params.spread * std::sqrt(rest));
  // Only reachable with absurd parameters on absurdly long text: saturate, never overflow.
  constexpr double kMax = 9.0e18;
  if (!(est < kMax)) return static_cast<std::int64_t>(kMax);
  return est < 1.0 ? 1 : static_cast<std::int64_t>(est);
}

std::int64_t estimate_tokens(std::string_view utf8, const EstimatorParams& params) {
  return finish_estimate(raw_cost_utf8(utf8, params), !utf8.empty(), params);
}

RawCost raw_cost_walked(const CodePoints& t, const EstimatorParams& params) noexcept {
  if (params.words.mode == kNoWords) return raw_cost(t, params);
  switch (t.width) {
    case 1:
      return walk(static_cast<const std::uint8_t*>(t.data), t.size, params, 0, true, true, NoWords{});
    case 2:
      return walk(static_cast<const std::uint16_t*>(t.data), t.size, params, 0, true, true, NoWords{});
    default:
      return walk(static_cast<const std::uint32_t*>(t.data), t.size, params, 0, true, true, NoWords{});
  }
}

RawCost raw_cost(const CodePoints& t, const EstimatorParams& params) noexcept {
  switch (t.width) {
    case 1:
      return raw_cost(static_cast<const std::uint8_t*>(t.data), t.size, params);
    case 2:
      return raw_cost(static_cast<const std::uint16_t*>(t.data), t.size, params);
    default:
      return raw_cost(static_cast<const std::uint32_t*>(t.data), t.size, params);
  }
}

std::int64_t estimate_tokens(const CodePoints& t, const EstimatorParams& params) noexcept {
  return finish_estimate(raw_cost(t, params), t.size > 0, params);
}

void for_each_word(const CodePoints& t, const EstimatorParams& params,
                   const std::function<void(std::size_t, std::size_t, bool)>& on_word) {
  if (params.words.mode == kNoWords) return;
  switch (t.width) {
    case 1:
      walk(static_cast<const std::uint8_t*>(t.data), t.size, params, 0, true, true, on_word);
      break;
    case 2:
      walk(static_cast<const std::uint16_t*>(t.data), t.size, params, 0, true, true, on_word);
      break;
    default:
      walk(static_cast<const std::uint32_t*>(t.data), t.size, params, 0, true, true, on_word);
      break;
  }
}

void estimate_tokens_batch(View<std::string_view> texts, const EstimatorParams& params, std::int64_t* out) {
  for (std::size_t i = 0; i < texts.size; ++i) out[i] = estimate_tokens(texts[i], params);
}

void estimate_tokens_batch(View<CodePoints> texts, const EstimatorParams& params, std::int64_t* out) noexcept {
  for (std::size_t i = 0; i < texts.size; ++i) out[i] = estimate_tokens(texts[i], params);
}

namespace {

template <class Unit>
void price_units(const Unit* cps, View<std::int64_t> ends, View<std::uint8_t> any_prefix, char32_t prefix_a,
                 char32_t prefix_b, const EstimatorParams& p, std::int64_t* out) {
  std::size_t begin = 0;
  for (std::size_t k = 0; k < ends.size; ++k) {
    const auto end = static_cast<std::size_t>(ends[k]);
    const Unit* piece = cps + begin;
    const std::size_t len = end - begin;
    // raw_cost starts from "no previous code point"; a prefix swaps the first pair's cost
    // for the cost after the prefix, and adds the prefix's own.
    if (p.words.mode != kNoWords) {
      // The word model: a piece's first word may continue one before it, and its last word
      // may continue into the next piece, so both are priced as words not found: the larger
      // of their pair costs and two word prices. A word of the whole text costs at most the
      // larger of its pair costs and two word prices, so whatever joins the pieces, it costs
      // at most what the pieces charge for its parts.
      const auto behind_words = [&](char32_t c) {
        RawCost r = walk(piece, len, p, c, false, false, NoWords{});
        r.units += cost(0, c, p);
        return finish_estimate(r, true, p);
      };
      if (begin == 0) {
        out[k] = finish_estimate(walk(piece, len, p, 0, true, false, NoWords{}), len > 0, p);
      } else if (any_prefix[k]) {
        out[k] = std::max(behind_words(prefix_a), behind_words(prefix_b));
      } else {
        out[k] = behind_words(static_cast<char32_t>(cps[begin - 1]));
      }
      begin = end;
      continue;
    }
    const RawCost body = raw_cost(piece, len, p);  // no words here: nothing is sure
    const auto behind = [&](char32_t c) {
      std::uint64_t raw = body.units + cost(0, c, p);
      if (len > 0) {
        const auto first = static_cast<char32_t>(piece[0]);
        raw = raw + cost(c, first, p) - cost(0, first, p);
      }
      return finish_estimate(RawCost{raw, 0}, true, p);
    };
    if (begin == 0) {
      out[k] = finish_estimate(body, len > 0, p);
    } else if (any_prefix[k]) {
      out[k] = std::max(behind(prefix_a), behind(prefix_b));
    } else {
      out[k] = behind(static_cast<char32_t>(cps[begin - 1]));
    }
    begin = end;
  }
}

}  // namespace

void price_pieces(const CodePoints& text, View<std::int64_t> ends, View<std::uint8_t> any_prefix, char32_t prefix_a,
                  char32_t prefix_b, const EstimatorParams& params, std::int64_t* out) {
  if (any_prefix.size != ends.size)
    throw std::invalid_argument("price_pieces: " + std::to_string(ends.size) + " piece ends but " +
                                std::to_string(any_prefix.size) + " prefix flags");
  std::int64_t prev = 0;
  for (std::size_t k = 0; k < ends.size; ++k) {
    if (ends[k] < prev || ends[k] > static_cast<std::int64_t>(text.size))
      throw std::invalid_argument("price_pieces: piece end " + std::to_string(ends[k]) + " at index " +
                                  std::to_string(k) + " is not within [" + std::to_string(prev) + ", " +
                                  std::to_string(text.size) + "]");
    prev = ends[k];
  }
  switch (text.width) {
    case 1:
      price_units(static_cast<const std::uint8_t*>(text.data), ends, any_prefix, prefix_a, prefix_b, params, out);
      break;
    case 2:
      price_units(static_cast<const std::uint16_t*>(text.data), ends, any_prefix, prefix_a, prefix_b, params, out);
      break;
    default:
      price_units(static_cast<const std::uint32_t*>(text.data), ends, any_prefix, prefix_a, prefix_b, params, out);
      break;
  }
}

}  // namespace ctxcore

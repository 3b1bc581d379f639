// The conservative token estimator. See estimator.hpp for the model; this file is the one
// pass over the code points (raw_cost) and the margin applied to its sum (finish_estimate).
#include "ctxcore/estimator.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

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
// A word's hash: the sum of (code point + 1) * kHashBase^position, mod 2^64, so that the
// scan can take any run's hash from prefix sums; probes finalize it first.
constexpr std::uint64_t kHashBase = 0x9E3779B97F4A7C15ull;  // odd: invertible mod 2^64

struct WordHash {
  std::uint64_t h = 0;
  std::uint64_t power = 1;  // kHashBase^(code points so far)
  void add(char32_t cp) noexcept {
    h += (std::uint64_t{cp} + 1) * power;
    power *= kHashBase;
  }
};

inline std::uint64_t finalize(std::uint64_t z) noexcept {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

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

// Whether the word whose finalized hash is `z` is in the vocabulary (see contains).
bool contains_finalized(const WordModel& w, std::uint64_t z) noexcept {
  const std::size_t mask = w.table.size() - 1;
  const std::uint32_t fp = static_cast<std::uint32_t>(z) | 1u;
  for (std::size_t i = static_cast<std::size_t>(z >> 32) & mask;; i = (i + 1) & mask) {
    const std::uint32_t e = w.table[i];
    if (e == fp) return true;
    if (e == 0) return false;
  }
}

bool contains(const WordModel& w, std::uint64_t h) noexcept { return contains_finalized(w, finalize(h)); }

// Writes the UTF-8 form of `c` (a lone surrogate as its 3-byte form) at `out`; its length.
std::size_t put_utf8(char* out, char32_t c) noexcept {
  if (c < 0x80) {
    out[0] = static_cast<char>(c);
    return 1;
  }
  if (c < 0x800) {
    out[0] = static_cast<char>(0xC0 | (c >> 6));
    out[1] = static_cast<char>(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = static_cast<char>(0xE0 | (c >> 12));
    out[1] = static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out[2] = static_cast<char>(0x80 | (c & 0x3F));
    return 3;
  }
  out[0] = static_cast<char>(0xF0 | ((c >> 18) & 0x07));
  out[1] = static_cast<char>(0x80 | ((c >> 12) & 0x3F));
  out[2] = static_cast<char>(0x80 | ((c >> 6) & 0x3F));
  out[3] = static_cast<char>(0x80 | (c & 0x3F));
  return 4;
}

// Whether some vocabulary word starts with the code points [cps, cps + n).
// `buckets`: ScanTables::buckets, or empty (then a binary search over all words).
template <class Unit>
bool is_word_prefix(const Unit* cps, std::size_t n, const WordModel& w,
                    const std::vector<std::uint32_t>& buckets) noexcept {
  if (n > w.max_word) return false;  // max_word <= kMaxWordCodePoints: the key fits `buf`
  char buf[4 * kMaxWordCodePoints];
  std::size_t size = 0;
  for (std::size_t i = 0; i < n; ++i) size += put_utf8(buf + size, static_cast<char32_t>(cps[i]));
  const std::string_view key(buf, size);
  const std::size_t count = w.offsets.size() - 1;
  const auto word = [&](std::size_t k) {
    return std::string_view(w.sorted).substr(w.offsets[k], w.offsets[k + 1] - w.offsets[k]);
  };
  std::size_t lo = 0, hi = count;  // first word >= key
  if (!buckets.empty() && size > 0) {
    const std::size_t b0 = static_cast<unsigned char>(buf[0]);
    // Words are sorted bytewise, so those sharing the key's first byte, and within them
    // those sharing its first two, are contiguous: a word that starts with the key is in
    // that range, and the first word >= the key is in it if any is.
    if (size == 1) return buckets[b0 << 8] < buckets[(b0 + 1) << 8];
    const std::size_t b = (b0 << 8) | static_cast<unsigned char>(buf[1]);
    lo = buckets[b];
    hi = buckets[b + 1];
  }
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (word(mid) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < count && word(lo).substr(0, key.size()) == key;
}

struct NoWords {
  void operator()(std::size_t, std::size_t, bool) const noexcept {}
};

// The raw cost of [cps, cps + n) with the word model. `prev` is the code point before the
// text (0: none). `first_credit`: a word that begins at index 0 may get the word price (false
// for a piece of a longer text, whose first word may be the tail of a longer one).
// `last_open`: the last word may still be extended by text that follows (the end of a whole
// text: word price while it is a vocabulary-word prefix); else it is priced by its pairs.
template <class Unit, class OnWord>
RawCost walk(const Unit* cps, std::size_t n, const EstimatorParams& p, char32_t prev, bool first_credit, bool last_open,
             OnWord&& on_word) {
  const WordModel& w = p.words;
  const bool o200k = w.mode == kWordsO200k;
  const std::uint64_t floor = 2 * std::uint64_t{w.cost};  // two tokens
  std::uint64_t total = 0, run = 0, last = 0, lead = 0;
  WordHash h;
  // The part of `total` priced as whole vocabulary words (with the leading character each
  // takes along): one token each whatever surrounds them, known rather than estimated.
  std::uint64_t sure = 0;
  std::size_t start = 0;
  bool in_run = false, credit = false, lower = false;
  std::uint8_t k1 = prev != 0 ? class_of(prev, w) : kClassStart;  // class of cps[i - 1]
  std::uint8_t k2 = kClassStart;                                  // class of cps[i - 2]
  // A word found in the vocabulary is one token: the word price, never above its pairs nor
  // below its leading character's pair cost. One not found is at least two tokens.
  const auto priced = [&](bool found) {
    return found ? std::min(run, std::max<std::uint64_t>(w.cost, lead)) : std::max(run, floor);
  };
  // No vocabulary word is longer than max_word code points: a longer one is not looked up.
  const auto in_vocabulary = [&](std::size_t end) { return end - start <= w.max_word && contains(w, h.h); };
  const auto close = [&](std::size_t end, bool open) -> std::uint64_t {
    if (!credit) return std::max(run, floor);
    bool found;
    if (!open) {
      found = in_vocabulary(end);
      on_word(start, end, found);
    } else {
      on_word(start, end, in_vocabulary(end));
      if (!last_open) return std::max(run, floor);
      found = is_word_prefix(cps + start, end - start, w, p.scan.buckets);
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
        h.add(cp);
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
        h = WordHash{};
        h.add(prev);
        h.add(cp);
        start = i - 1;
      } else {
        lead = 0;
        run = c;
        h = WordHash{};
        h.add(cp);
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

// ---- the two-pass scan -------------------------------------------------------------------
// The walk above, for a whole text, in passes over segments of kScanSegment code points:
// the first finds every code point's cost and class with no branch on either (costs of
// pairs below 256 come ready from ScanTables::latin) and keeps prefix sums of the costs and
// of the word hash's terms; the second visits only the words, found as runs of set bits in
// a letter mask, and takes each word's cost and hash from those sums (o200k_base's splits
// before an upper-case letter from masks of upper- and lower-case letters); the third
// looks the words up, each table slot fetched ahead. The sum of all costs, less each
// word's costs (its leading character included), plus each word's price, is the walk's
// total: the same numbers, so the same estimates.

inline std::uint8_t scan_info(char32_t cp, const ScanTables& t) noexcept {
  if (cp < kClassLimit) return t.info[cp];
  return cp < 0x323B0 ? static_cast<std::uint8_t>(kClassLetterOther | kScanLetter) : std::uint8_t{kClassOther};
}

// The first index in [from, to) whose bit is set in `masks`, or `to`.
inline std::size_t next_set(const std::uint64_t* masks, std::size_t from, std::size_t to) noexcept {
  if (from >= to) return to;
  std::size_t q = from >> 6;
  std::uint64_t bits = masks[q] & (~std::uint64_t{0} << (from & 63));
  const std::size_t last = (to - 1) >> 6;
  while (bits == 0) {
    if (++q > last) return to;
    bits = masks[q];
  }
  return std::min(to, (q << 6) + static_cast<std::size_t>(__builtin_ctzll(bits)));
}

// The first index in [from, to) whose bit is clear in `masks`, or `to`.
inline std::size_t next_clear(const std::uint64_t* masks, std::size_t from, std::size_t to) noexcept {
  if (from >= to) return to;
  std::size_t q = from >> 6;
  std::uint64_t bits = ~masks[q] & (~std::uint64_t{0} << (from & 63));
  const std::size_t last = (to - 1) >> 6;
  while (bits == 0) {
    if (++q > last) return to;
    bits = ~masks[q];
  }
  return std::min(to, (q << 6) + static_cast<std::size_t>(__builtin_ctzll(bits)));
}

// A word closed in a segment, priced once its vocabulary probe is done.
struct Closed {
  std::uint64_t h, run, lead;
  bool probe;  // short enough to be a vocabulary word
};

template <class Unit, bool O200k>
RawCost scan(const Unit* cps, std::size_t n, const EstimatorParams& p) noexcept {
  constexpr std::size_t kSeg = kScanSegment;
  constexpr std::size_t kMasks = kSeg / 64;
  constexpr bool o200k = O200k;
  const WordModel& w = p.words;
  const ScanTables& t = p.scan;
  const std::uint64_t one = w.cost;
  const std::uint64_t floor = 2 * one;
  const std::uint16_t* latin = t.latin.data();
  const std::uint64_t* powers = t.powers.data();
  const std::uint64_t* inverse = t.inverse_powers.data();
  std::uint64_t costs[kSeg + 1];   // costs[j]: the costs of code points [0, j) of the segment
  std::uint64_t hashes[kSeg + 1];  // hashes[j]: sum of (cp + 1) * kHashBase^i over [0, j)
  std::uint8_t infos[kSeg];
  std::uint64_t letters[kMasks], uppers[kMasks], lowers[kMasks];
  Closed closed[kSeg + 1];
  std::uint64_t finals[kSeg + 1];

  std::uint64_t all = 0;  // every code point's cost
  std::uint64_t adj = 0;  // per word: its price less its costs (mod 2^64, as the walk's total is)
  std::uint64_t sure = 0;
  // The two code points before the segment: classes and the cost of the nearer one.
  std::uint8_t k1 = kClassStart, k2 = kClassStart;
  std::uint64_t c1 = 0;
  char32_t prev = 0;
  unsigned digit = 0;  // position of the next ASCII digit in its group of three
  // The word being read, which may run on into the next segment.
  bool open = false, lower = false;
  WordHash h;
  std::uint64_t run = 0, lead = 0;
  std::size_t start = 0;
  std::size_t nclosed = 0;

  const auto price = [&](bool found, std::uint64_t r, std::uint64_t l) {
    const std::uint64_t v = found ? std::min(r, std::max<std::uint64_t>(one, l)) : std::max(r, floor);
    adj += v - r;
    if (found) sure += v;
  };

  for (std::size_t a = 0; a < n; a += kSeg) {
    const std::size_t m = std::min(kSeg, n - a);
    const std::size_t words = (m + 63) / 64;
    // Pass 1: costs, classes, hash terms and the masks, 64 code points to a mask word.
    costs[0] = 0;
    hashes[0] = 0;
    for (std::size_t q = 0; q < words; ++q) {
      const std::size_t end = std::min(m, q * 64 + 64);
      std::uint64_t lm = 0, um = 0, om = 0;
      for (std::size_t j = q * 64; j < end; ++j) {
        const auto cp = static_cast<char32_t>(cps[a + j]);
        const std::uint8_t info = scan_info(cp, t);
        std::uint64_t c;
        if (sizeof(Unit) == 1 || (prev | cp) < 256) {
          c = latin[(static_cast<std::size_t>(prev) << 8) | cp];
        } else {
          c = cost(prev, cp, p);
          if (cp >= 0x80) {
            if (!(info & kScanSingle)) {
              c = std::max(c, floor);
            } else if (cp == prev) {
              c = std::max(c, one);
            }
          } else if ((cp < 0x20 || cp == 0x7F) && cp != '\t' && cp != '\n' && cp != '\r') {
            c = std::max(c, one);  // (a repeat needs prev == cp < 256: the table's case)
          }
        }
        if (static_cast<std::uint32_t>(cp) - '0' < 10u) {
          c = digit == 0 ? one : 0;
          digit = digit == 2 ? 0 : digit + 1;
        } else {
          digit = 0;
        }
        costs[j + 1] = costs[j] + c;
        hashes[j + 1] = hashes[j] + (std::uint64_t{cp} + 1) * powers[j];
        infos[j] = info;
        lm |= static_cast<std::uint64_t>((info >> 4) & 1u) << (j & 63);
        if constexpr (O200k) {
          const std::uint8_t k = info & kScanClassMask;
          um |= static_cast<std::uint64_t>(k == kClassUpper) << (j & 63);
          om |= static_cast<std::uint64_t>(k == kClassLower) << (j & 63);
        }
        prev = cp;
      }
      letters[q] = lm;
      uppers[q] = um;
      lowers[q] = om;
    }
    all += costs[m];
    const auto klass = [&](std::ptrdiff_t j) -> std::uint8_t {
      if (j >= 0) return infos[j] & kScanClassMask;
      return j == -1 ? k1 : k2;
    };
    const auto close = [&](std::size_t end) {  // the open word ends before segment index `end`
      closed[nclosed++] = Closed{h.h, run, lead, a + end - start <= w.max_word};
      open = false;
    };
    // Pass 2: the words, as runs of set bits in the letter mask.
    if (open && !(letters[0] & 1u)) close(0);
    std::size_t j = 0;
    while (j < m) {
      const std::size_t s = next_set(letters, j, m);
      if (s == m) break;
      const std::size_t e = next_clear(letters, s, m);
      // A word still open here runs on from the segment before (then s is 0).
      std::size_t i = s;
      while (i < e) {
        if (!open) {
          // A word begins at i: with the character before it when the pattern attaches it.
          const std::size_t g = a + i;
          const std::uint8_t p1 = klass(static_cast<std::ptrdiff_t>(i) - 1);
          const std::uint8_t p2 = klass(static_cast<std::ptrdiff_t>(i) - 2);
          open = true;
          lower = false;
          h = WordHash{};
          if (g > 0 && attachable(p1, o200k) && (p1 == kClassSpace || ends_chunk(p2, o200k))) {
            lead = i > 0 ? costs[i] - costs[i - 1] : c1;
            h.add(static_cast<char32_t>(cps[g - 1]));
            start = g - 1;
          } else {
            lead = 0;
            start = g;
          }
          run = lead;
        }
        // Where this word ends: at e, or (o200k_base) before an upper-case letter that
        // follows a lower-case one in it.
        std::size_t u = e;
        if constexpr (O200k) {
          const std::size_t first_lower = lower ? i : next_set(lowers, i, e);
          if (first_lower < e) {
            u = next_set(uppers, lower ? i : first_lower + 1, e);
            lower = true;
          }
        }
        // The letters [i, u) join the word.
        h.h += h.power * ((hashes[u] - hashes[i]) * inverse[i]);
        h.power *= powers[u - i];
        run += costs[u] - costs[i];
        i = u;
        if (u < e) {
          close(u);
          continue;
        }
        // The run ends at e: the word ends there unless the segment does and the text goes on.
        if (e < m) {
          close(e);
        } else if (a + m == n) {
          // The text's last word: priced as a word while a vocabulary word starts with it.
          price(is_word_prefix(cps + start, n - start, w, t.buckets), run, lead);
          open = false;
        }
      }
      j = e;
    }
    // Pass 3: the vocabulary probes of the words closed here, each table slot fetched
    // ahead of its probe so that the fetches overlap.
    const std::size_t mask = w.table.size() - 1;
    for (std::size_t k = 0; k < nclosed; ++k) {
      finals[k] = finalize(closed[k].h);
      __builtin_prefetch(&w.table[static_cast<std::size_t>(finals[k] >> 32) & mask]);
    }
    for (std::size_t k = 0; k < nclosed; ++k)
      price(closed[k].probe && contains_finalized(w, finals[k]), closed[k].run, closed[k].lead);
    nclosed = 0;
    // The two code points before the next segment.
    k2 = m >= 2 ? static_cast<std::uint8_t>(infos[m - 2] & kScanClassMask) : k1;
    k1 = infos[m - 1] & kScanClassMask;
    c1 = costs[m] - costs[m - 1];
  }
  // As the walk ends: a character that a following letter would take into its word ends
  // the text (a letter is never attachable, so this is never after a word).
  if (n > 0 && attachable(k1, o200k) && (k1 == kClassSpace || ends_chunk(k2, o200k))) sure += c1;
  return RawCost{all + adj, sure};
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
  std::vector<std::string_view> words;
  std::vector<std::uint64_t> hashes;
  std::vector<char32_t> single;
  w.run_max.assign(128, 0);
  std::size_t pos = 0;
  while (pos < words_utf8.size()) {
    std::size_t end = words_utf8.find('\0', pos);
    if (end == std::string_view::npos) end = words_utf8.size();
    const std::string_view word = words_utf8.substr(pos, end - pos);
    if (word.empty()) throw std::invalid_argument("estimator word " + std::to_string(words.size()) + " is empty");
    WordHash h;
    std::size_t cps = 0;
    for (std::size_t i = 0; i < word.size();) {
      char32_t cp = 0;
      const std::size_t len = decode(word, i, cp);
      if (len == 0)
        throw std::invalid_argument("estimator word " + std::to_string(words.size()) + " is not valid UTF-8");
      h.add(cp);
      i += len;
      ++cps;
    }
    if (cps > kMaxWordCodePoints)
      throw std::invalid_argument("estimator word " + std::to_string(words.size()) + " is longer than " +
                                  std::to_string(kMaxWordCodePoints) + " code points");
    w.max_word = std::max(w.max_word, cps);
    if (cps == 1) {
      char32_t cp = 0;
      decode(word, 0, cp);
      if (cp < kClassLimit) single.push_back(cp);
    }
    const auto first = static_cast<unsigned char>(word[0]);
    if (first < 0x80 && word.find_first_not_of(word[0]) == std::string_view::npos)
      w.run_max[first] =
          static_cast<std::uint8_t>(std::min<std::size_t>(std::max<std::size_t>(w.run_max[first], cps), 255));
    words.push_back(word);
    hashes.push_back(h.h);
    pos = end + 1;
  }
  std::size_t size = 16;
  while (size < hashes.size() * 5 / 3 + 1) size <<= 1;
  w.table.assign(size, 0);
  for (const std::uint64_t h : hashes) {
    const std::uint64_t z = finalize(h);
    const std::uint32_t fp = static_cast<std::uint32_t>(z) | 1u;
    for (std::size_t i = static_cast<std::size_t>(z >> 32) & (size - 1);; i = (i + 1) & (size - 1)) {
      if (w.table[i] == fp) break;
      if (w.table[i] == 0) {
        w.table[i] = fp;
        break;
      }
    }
  }
  w.single.assign(kClassLimit / 64, 0);
  for (const char32_t cp : single) w.single[cp >> 6] |= std::uint64_t{1} << (cp & 63);
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  w.offsets.reserve(words.size() + 1);
  for (const std::string_view word : words) {
    w.offsets.push_back(static_cast<std::uint32_t>(w.sorted.size()));
    w.sorted.append(word);
  }
  w.offsets.push_back(static_cast<std::uint32_t>(w.sorted.size()));
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
    const std::size_t t = w.table.size();
    if ((w.mode != kWordsCl100k && w.mode != kWordsO200k) || w.classes.size() != kClassLimit || t < 2 ||
        (t & (t - 1)) != 0 || w.offsets.empty() || w.offsets.back() != w.sorted.size() ||
        w.single.size() != kClassLimit / 64 || w.run_max.size() != 128)
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
      if ((w.single[cp >> 6] >> (cp & 63)) & 1u) info |= kScanSingle;
      t.info[cp] = info;
    }
    // Every adjustment of the walk that depends on the code point and the one before it.
    const std::uint64_t one = w.cost;
    t.latin.resize(kLatinPairs);
    bool fits = true;
    for (char32_t prev = 0; prev < 256; ++prev) {
      for (char32_t cp = 0; cp < 256; ++cp) {
        std::uint64_t c = cost(prev, cp, params);
        if (cp >= 0x80) {
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
        t.latin[(static_cast<std::size_t>(prev) << 8) | cp] = static_cast<std::uint16_t>(c);
      }
    }
    // A word price past 32 tokens: the costs do not fit the table, so texts are walked.
    if (!fits) {
      params.scan = ScanTables{};
      return;
    }
    t.powers.resize(kScanSegment + 1);
    t.inverse_powers.resize(kScanSegment + 1);
    std::uint64_t inv = kHashBase;  // Newton's iteration: each step doubles the correct low bits
    for (int k = 0; k < 6; ++k) inv *= 2 - kHashBase * inv;
    t.powers[0] = t.inverse_powers[0] = 1;
    for (std::size_t k = 1; k <= kScanSegment; ++k) {
      t.powers[k] = t.powers[k - 1] * kHashBase;
      t.inverse_powers[k] = t.inverse_powers[k - 1] * inv;
    }
    const std::size_t count = w.offsets.size() - 1;
    t.buckets.assign(65537, static_cast<std::uint32_t>(count));
    // Bucket of word k: its first byte and its second (0 for a one-byte word); words are
    // sorted bytewise, so bucket numbers never decrease along them.
    std::size_t next = 0;  // first bucket not yet given its start
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t off = w.offsets[k];
      const std::size_t len = w.offsets[k + 1] - off;
      const std::size_t b = (static_cast<std::size_t>(static_cast<unsigned char>(w.sorted[off])) << 8) |
                            (len > 1 ? static_cast<unsigned char>(w.sorted[off + 1]) : 0u);
      for (; next <= b; ++next) t.buckets[next] = static_cast<std::uint32_t>(k);
    }
  }
  params.scan = std::move(t);
}

template <class Unit>
RawCost raw_cost(const Unit* cps, std::size_t n, const EstimatorParams& params) noexcept {
  if (params.words.mode != kNoWords) {
    if (!params.scan.latin.empty()) {
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

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
constexpr std::uint64_t kHashSeed = 0xCBF29CE484222325ull;

inline std::uint64_t mix(std::uint64_t h, char32_t cp) noexcept { return (h ^ cp) * 0x100000001B3ull; }

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

bool contains(const WordModel& w, std::uint64_t h) noexcept {
  const std::uint64_t z = finalize(h);
  const std::size_t mask = w.table.size() - 1;
  const std::uint32_t fp = static_cast<std::uint32_t>(z) | 1u;
  for (std::size_t i = static_cast<std::size_t>(z >> 32) & mask;; i = (i + 1) & mask) {
    const std::uint32_t e = w.table[i];
    if (e == fp) return true;
    if (e == 0) return false;
  }
}

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
template <class Unit>
bool is_word_prefix(const Unit* cps, std::size_t n, const WordModel& w) noexcept {
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
  std::uint64_t total = 0, run = 0, last = 0, lead = 0, h = 0;
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
  const auto close = [&](std::size_t end, bool open) -> std::uint64_t {
    if (!credit) return std::max(run, floor);
    bool found;
    if (!open) {
      found = contains(w, h);
      on_word(start, end, found);
    } else {
      on_word(start, end, contains(w, h));
      if (!last_open) return std::max(run, floor);
      found = is_word_prefix(cps + start, end - start, w);
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
        h = mix(h, cp);
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
        h = mix(mix(kHashSeed, prev), cp);
        start = i - 1;
      } else {
        lead = 0;
        run = c;
        h = mix(kHashSeed, cp);
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
    std::uint64_t h = kHashSeed;
    std::size_t cps = 0;
    for (std::size_t i = 0; i < word.size();) {
      char32_t cp = 0;
      const std::size_t len = decode(word, i, cp);
      if (len == 0)
        throw std::invalid_argument("estimator word " + std::to_string(words.size()) + " is not valid UTF-8");
      h = mix(h, cp);
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
    hashes.push_back(h);
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

template <class Unit>
RawCost raw_cost(const Unit* cps, std::size_t n, const EstimatorParams& params) noexcept {
  if (params.words.mode != kNoWords) return walk(cps, n, params, 0, true, true, NoWords{});
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

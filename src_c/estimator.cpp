// The conservative token estimator. See estimator.hpp for the model; this file is the one
// pass over the code points (raw_cost) and the margin applied to its sum (finish_estimate).
#include "ctxcore/estimator.hpp"

#include <cmath>
#include <string>

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

}  // namespace

void validate(const EstimatorParams& p) {
  if (p.pair_bits < kMinPairBits || p.pair_bits > kMaxPairBits)
    throw std::invalid_argument("estimator pair_bits must be in [" + std::to_string(kMinPairBits) + ", " +
                                std::to_string(kMaxPairBits) + "], got " + std::to_string(p.pair_bits));
  if (p.latin_costs.size() != kLatinPairs)
    throw std::invalid_argument("estimator latin_costs must have " + std::to_string(kLatinPairs) +
                                " entries, got " + std::to_string(p.latin_costs.size()));
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
}

template <class Unit>
std::uint64_t raw_cost(const Unit* cps, std::size_t n, const EstimatorParams& params) noexcept {
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
    return total;
  }
  std::uint64_t total = 0;
  char32_t prev = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto cp = static_cast<char32_t>(cps[i]);
    total += cost(prev, cp, params);
    prev = cp;
  }
  return total;
}

template std::uint64_t raw_cost<std::uint8_t>(const std::uint8_t*, std::size_t, const EstimatorParams&) noexcept;
template std::uint64_t raw_cost<std::uint16_t>(const std::uint16_t*, std::size_t, const EstimatorParams&) noexcept;
template std::uint64_t raw_cost<std::uint32_t>(const std::uint32_t*, std::size_t, const EstimatorParams&) noexcept;
template std::uint64_t raw_cost<char32_t>(const char32_t*, std::size_t, const EstimatorParams&) noexcept;

std::uint64_t raw_cost_utf8(std::string_view utf8, const EstimatorParams& params) noexcept {
  std::uint64_t total = 0;
  char32_t prev = 0;
  for_each_utf8(utf8, [&](char32_t cp) {
    total += cost(prev, cp, params);
    prev = cp;
  });
  return total;
}

std::int64_t finish_estimate(std::uint64_t raw_units, bool nonempty, const EstimatorParams& params) noexcept {
  if (!nonempty) return 0;
  const double raw = static_cast<double>(raw_units) / kCostUnit;
  const double est = std::ceil(params.scale * raw + params.spread * std::sqrt(raw));
  // Only reachable with absurd parameters on absurdly long text: saturate, never overflow.
  constexpr double kMax = 9.0e18;
  if (!(est < kMax)) return static_cast<std::int64_t>(kMax);
  return est < 1.0 ? 1 : static_cast<std::int64_t>(est);
}

std::int64_t estimate_tokens(std::string_view utf8, const EstimatorParams& params) noexcept {
  return finish_estimate(raw_cost_utf8(utf8, params), !utf8.empty(), params);
}

std::int64_t estimate_tokens(const CodePoints& t, const EstimatorParams& params) noexcept {
  std::uint64_t raw = 0;
  switch (t.width) {
    case 1:
      raw = raw_cost(static_cast<const std::uint8_t*>(t.data), t.size, params);
      break;
    case 2:
      raw = raw_cost(static_cast<const std::uint16_t*>(t.data), t.size, params);
      break;
    default:
      raw = raw_cost(static_cast<const std::uint32_t*>(t.data), t.size, params);
      break;
  }
  return finish_estimate(raw, t.size > 0, params);
}

void estimate_tokens_batch(View<std::string_view> texts, const EstimatorParams& params,
                           std::int64_t* out) noexcept {
  for (std::size_t i = 0; i < texts.size; ++i) out[i] = estimate_tokens(texts[i], params);
}

void estimate_tokens_batch(View<CodePoints> texts, const EstimatorParams& params, std::int64_t* out) noexcept {
  for (std::size_t i = 0; i < texts.size; ++i) out[i] = estimate_tokens(texts[i], params);
}

namespace {

template <class Unit>
void price_units(const Unit* cps, View<std::int64_t> ends, View<std::uint8_t> any_prefix, char32_t prefix_a,
                 char32_t prefix_b, const EstimatorParams& p, std::int64_t* out) noexcept {
  std::size_t begin = 0;
  for (std::size_t k = 0; k < ends.size; ++k) {
    const auto end = static_cast<std::size_t>(ends[k]);
    const Unit* piece = cps + begin;
    const std::size_t len = end - begin;
    // raw_cost starts from "no previous code point"; a prefix swaps the first pair's cost
    // for the cost after the prefix, and adds the prefix's own.
    const std::uint64_t body = raw_cost(piece, len, p);
    const auto behind = [&](char32_t c) {
      std::uint64_t raw = body + cost(0, c, p);
      if (len > 0) {
        const auto first = static_cast<char32_t>(piece[0]);
        raw = raw + cost(c, first, p) - cost(0, first, p);
      }
      return finish_estimate(raw, true, p);
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

// The knapsack packer. See packer.hpp for the pipeline; each step is one function here,
// called in order by pack() at the bottom of the file.
//
// Arithmetic is exact: tokens are bounded by kMaxTokens and the candidate count by
// kMaxCandidates so that every token sum fits in int64 without overflow checks in the
// hot loops, and budgets above any possible sum are clamped (which changes no decision).
#include "ctxcore/packer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <unordered_map>

namespace ctxcore {
namespace {

// The grouped path is kept out of line and marked cold: the call without groups is the hot
// one, and its code should not be laid out around the grouped steps.
#if defined(__GNUC__) || defined(__clang__)
#define CTXCORE_COLD __attribute__((noinline, cold))
#else
#define CTXCORE_COLD
#endif

// Budgets above every possible token sum (see kMaxTokens) are clamped to this.
constexpr std::int64_t kBudgetClamp = std::int64_t{1} << 62;
// Bound on applied 1-for-1 swaps per call: each costs O(m log m), and after the core step
// there are rarely more than a few left to find.
constexpr int kMaxSwaps = 16;
// Cells of the exact DP around the density break that raises the bar bound fixing is
// measured against: 2**14 cells are ~10 us and usually bring the bar to the optimum.
constexpr std::int64_t kBarCells = std::int64_t{1} << 14;
// Rounds of bound fixing: each costs O(m log m) and runs only after the bar rose; the
// free set rarely shrinks further after the third.
constexpr int kMaxFixRounds = 4;
// The sparse exact DP is tried only when at most this many free items fit together: its
// state lists stay short then, and on sets of many small items they would not.
constexpr std::int64_t kParetoMaxFit = 64;

std::string shown_id(std::string_view id) {
  constexpr std::size_t kShown = 80;
  std::string out = "'";
  out.append(id.substr(0, kShown));
  if (id.size() > kShown) out += "...";
  out += "'";
  return out;
}

[[noreturn]] void fail(const PackInput& in, std::size_t i, const std::string& what) {
  std::string id(in.ids[i]);
  throw InvalidCandidate("candidate " + shown_id(id) + " (index " + std::to_string(i) + "): " + what,
                         static_cast<std::int64_t>(i), id);
}

// ---- step 1: validation and ranking ------------------------------------------------

void validate_options(const PackOptions& opt) {
  if (opt.bucket_tokens <= 0)
    throw std::invalid_argument("bucket_tokens must be > 0, got " + std::to_string(opt.bucket_tokens));
  if (opt.cell_ceiling <= 0)
    throw std::invalid_argument("cell_ceiling must be > 0, got " + std::to_string(opt.cell_ceiling));
  if (opt.core_cell_limit < 0)
    throw std::invalid_argument("core_cell_limit must be >= 0, got " + std::to_string(opt.core_cell_limit));
  if (opt.search_node_limit < 0)
    throw std::invalid_argument("search_node_limit must be >= 0, got " + std::to_string(opt.search_node_limit));
  if (!(opt.rank_tolerance >= 0.0 && opt.rank_tolerance < 1.0))
    throw std::invalid_argument("rank_tolerance must be in [0, 1), got " + std::to_string(opt.rank_tolerance));
}

// A hash of an id for the duplicate check: eight bytes at a time, multiply-xorshift mixed
// (ids are short; only the table's speed, never a result, depends on its quality).
std::uint64_t id_hash(std::string_view id) {
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ULL;
  std::uint64_t h = id.size() * kMul;
  std::size_t at = 0;
  for (; at + 8 <= id.size(); at += 8) {
    std::uint64_t word;
    std::memcpy(&word, id.data() + at, 8);
    h = (h ^ word) * kMul;
    h ^= h >> 29;
  }
  if (at < id.size()) {
    // Byte by byte: a copy of variable length is a library call and a stalled reload.
    std::uint64_t word = 0;
    for (unsigned shift = 0; at < id.size(); ++at, shift += 8)
      word |= static_cast<std::uint64_t>(static_cast<unsigned char>(id[at])) << shift;
    h = (h ^ word) * kMul;
    h ^= h >> 29;
  }
  h *= kMul;
  return h ^ (h >> 32);
}

void validate_candidates(const PackInput& in) {
  const std::size_t n = in.ids.size;
  if (in.tokens.size != n || in.scores.size != n || (in.pinned.size != 0 && in.pinned.size != n) ||
      (in.groups.size != 0 && in.groups.size != n)) {
    throw InvalidCandidate("mismatched lengths: " + std::to_string(n) + " ids, " + std::to_string(in.tokens.size) +
                               " tokens, " + std::to_string(in.scores.size) + " scores, " +
                               std::to_string(in.pinned.size) + " pinned flags" +
                               (in.groups.size != 0 ? ", " + std::to_string(in.groups.size) + " groups" : ""),
                           -1, "");
  }
  if (n > kMaxCandidates) {
    throw InvalidCandidate("too many candidates: " + std::to_string(n) + " > " + std::to_string(kMaxCandidates), -1,
                           "");
  }
  double positive_sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (in.ids[i].empty()) fail(in, i, "id must be a non-empty string");
    if (in.tokens[i] < 0) fail(in, i, "tokens must be >= 0, got " + std::to_string(in.tokens[i]));
    if (in.tokens[i] > kMaxTokens) fail(in, i, "tokens must be <= 2**40, got " + std::to_string(in.tokens[i]));
    if (!std::isfinite(in.scores[i])) fail(in, i, "score must be finite");
    if (in.scores[i] > 0.0) {
      positive_sum += in.scores[i];
      if (!std::isfinite(positive_sum)) fail(in, i, "scores are so large that their sum overflows");
    }
  }
  for (std::size_t i = 0; i < in.groups.size; ++i)
    if (in.groups[i] < -1) fail(in, i, "group must be >= 0, or -1 for none, got " + std::to_string(in.groups[i]));
  // Duplicate ids: an open-addressing table of input positions, O(n) expected.
  static_assert(kMaxCandidates < std::numeric_limits<std::uint32_t>::max(), "positions fit in 32 bits");
  std::size_t slots = 16;
  while (slots < 2 * n) slots <<= 1;
  const auto empty = static_cast<std::uint32_t>(n);
  std::vector<std::uint32_t> table(slots, empty);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t h = static_cast<std::size_t>(id_hash(in.ids[i])) & (slots - 1);
    while (table[h] != empty) {
      if (in.ids[table[h]] == in.ids[i])
        fail(in, i, "duplicate id (first seen at index " + std::to_string(table[h]) + ")");
      h = (h + 1) & (slots - 1);
    }
    table[h] = static_cast<std::uint32_t>(i);
  }
}

// ---- ordering: one stable radix sort for every order the packer needs ---------------
// Positions 0..n-1 ordered by ascending `keys`, equal keys keeping their position order
// (an LSD radix sort on 8-bit digits). Digits on which every key agrees are neither counted
// nor sorted on, so small token counts cost two passes and scores at most eight. O(n) per
// pass; on 1,000 items several times faster than a comparison sort.
template <class Key>
std::vector<std::size_t> stable_order(const std::vector<Key>& keys) {
  constexpr std::size_t kDigits = sizeof(Key);
  const std::size_t n = keys.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (n < 2) return order;
  Key differ = 0;
  for (Key k : keys) differ |= static_cast<Key>(k ^ keys[0]);
  int digits[kDigits];
  int passes = 0;
  for (int d = 0; d < static_cast<int>(kDigits); ++d)
    if ((differ >> (8 * d)) & 0xFFU) digits[passes++] = d;
  if (passes == 0) return order;
  std::vector<std::uint32_t> count(static_cast<std::size_t>(passes) * 256, 0);
  for (Key k : keys)
    for (int q = 0; q < passes; ++q) ++count[static_cast<std::size_t>(q) * 256 + ((k >> (8 * digits[q])) & 0xFFU)];
  // Positions < 2**22 (kMaxCandidates): 32-bit while sorting, half the memory traffic.
  std::vector<Key> key(keys), key2(n);
  std::vector<std::uint32_t> at_pos(n), at_pos2(n);
  std::iota(at_pos.begin(), at_pos.end(), std::uint32_t{0});
  for (int q = 0; q < passes; ++q) {
    std::uint32_t* c = count.data() + static_cast<std::size_t>(q) * 256;
    std::uint32_t sum = 0;
    for (int b = 0; b < 256; ++b) {
      const std::uint32_t here = c[b];
      c[b] = sum;
      sum += here;
    }
    const int shift = 8 * digits[q];
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t at = c[(key[i] >> shift) & 0xFFU]++;
      key2[at] = key[i];
      at_pos2[at] = at_pos[i];
    }
    key.swap(key2);
    at_pos.swap(at_pos2);
  }
  for (std::size_t i = 0; i < n; ++i) order[i] = at_pos[i];
  return order;
}

// The same order for keys that mostly differ in their high 32 bits (doubles do): radix on
// those bits, then each run of equal high halves (a few items at most, unless the input
// is built to collide) sorted stably by the whole key. Half the passes of the full sort.
std::vector<std::size_t> stable_order_wide(const std::vector<std::uint64_t>& keys) {
  std::vector<std::uint32_t> high(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) high[i] = static_cast<std::uint32_t>(keys[i] >> 32);
  std::vector<std::size_t> order = stable_order(high);
  const auto by_key = [&](std::size_t x, std::size_t y) { return keys[x] < keys[y]; };
  for (std::size_t a = 0, n = order.size(); a < n;) {
    std::size_t b = a + 1;
    while (b < n && high[order[b]] == high[order[a]]) ++b;
    if (b - a > 16) {
      std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(a), order.begin() + static_cast<std::ptrdiff_t>(b),
                       by_key);
    } else {
      for (std::size_t i = a + 1; i < b; ++i) {  // insertion sort: stable, and cheap on a short run
        const std::size_t x = order[i];
        std::size_t j = i;
        for (; j > a && by_key(x, order[j - 1]); --j) order[j] = order[j - 1];
        order[j] = x;
      }
    }
    a = b;
  }
  return order;
}

// A key whose unsigned order is the double's descending numeric order (-0.0 as 0.0).
// Defined for finite doubles, which validation guarantees.
std::uint64_t descending_key(double x) {
  if (x == 0.0) x = 0.0;
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint64_t ascending = (bits >> 63) ? ~bits : bits | (std::uint64_t{1} << 63);
  return ~ascending;
}

// Descending score, then ascending id (UTF-8 byte order, which is code point order).
// Ids are unique, so this is a total order and the ranking is independent of input order.
// Sorted on the score keys; a run of equal scores (rare) is then put in id order.
std::vector<std::size_t> rank_candidates(const PackInput& in) {
  const std::size_t n = in.ids.size;
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = descending_key(in.scores[i]);
  std::vector<std::size_t> order = stable_order_wide(keys);
  for (std::size_t a = 0; a < n;) {
    std::size_t b = a + 1;
    while (b < n && keys[order[b]] == keys[order[a]]) ++b;
    if (b - a > 1)
      std::sort(order.begin() + static_cast<std::ptrdiff_t>(a), order.begin() + static_cast<std::ptrdiff_t>(b),
                [&](std::size_t x, std::size_t y) { return in.ids[x] < in.ids[y]; });
    a = b;
  }
  return order;
}

// ---- the optimization pool --------------------------------------------------------
// Non-pinned candidates with a positive score and 0 < tokens <= capacity, in rank order.
struct Pool {
  std::vector<std::size_t> input;  // input position of each pool item
  std::vector<std::int64_t> t;
  std::vector<double> v;
  std::vector<std::size_t> by_density;  // pool positions, score/token descending, rank ties
  std::vector<std::size_t> by_tokens;   // pool positions, tokens ascending, rank ties
  // Grouped packing only (else empty): each item's group, a compact id below `groups`.
  std::vector<std::uint32_t> group;
  std::size_t groups = 0;
  std::int64_t capacity = 0;

  std::size_t size() const { return t.size(); }
};

// Score/token descending, pool position (rank) among equal densities: densities are
// positive, so their bit patterns order them.
void order_by_density(Pool& pool) {
  std::vector<std::uint64_t> keys(pool.size());
  for (std::size_t p = 0; p < keys.size(); ++p) keys[p] = descending_key(pool.v[p] / static_cast<double>(pool.t[p]));
  pool.by_density = stable_order_wide(keys);
}

// Pool positions by ascending tokens, rank order among equal tokens.
std::vector<std::size_t> positions_by_tokens(const Pool& pool) {
  std::vector<std::uint64_t> keys(pool.t.begin(), pool.t.end());  // tokens are >= 0
  return stable_order(keys);
}

void order_by_tokens(Pool& pool) { pool.by_tokens = positions_by_tokens(pool); }

// The pool items whose positions `keep` marks, in the same (rank) order, with `capacity`.
Pool subset(const Pool& pool, const std::vector<char>& keep, std::int64_t capacity) {
  Pool out;
  out.capacity = capacity;
  for (std::size_t p = 0; p < pool.size(); ++p) {
    if (!keep[p]) continue;
    out.input.push_back(pool.input[p]);
    out.t.push_back(pool.t[p]);
    out.v.push_back(pool.v[p]);
  }
  return out;
}

std::int64_t chosen_tokens(const Pool& pool, const std::vector<char>& chosen) {
  // Branch-free (a selection is no pattern a branch predictor learns): vectorizes.
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < pool.size(); ++i) sum += chosen[i] != 0 ? pool.t[i] : 0;
  return sum;
}

// LP relaxation of the pool: whole items by density, then a fraction of the break item.
double lp_bound(const Pool& pool) {
  std::int64_t room = pool.capacity;
  double bound = 0.0;
  for (std::size_t p : pool.by_density) {
    if (pool.t[p] <= room) {
      room -= pool.t[p];
      bound += pool.v[p];
    } else {
      bound += pool.v[p] * (static_cast<double>(room) / static_cast<double>(pool.t[p]));
      break;
    }
  }
  return bound;
}

// ---- step 3: exact reductions -------------------------------------------------------
// Both keep at least one optimal packing, so the optimum, the LP bound's validity and
// `proven_optimal` are unaffected; what they remove is decided here, once.

// Dominance. Item d dominates item j when t_d <= t_j and v_d >= v_j, ties (equal tokens
// and score) going to the earlier-ranked item, as the packer's score-then-id order does.
// If the items dominating j cannot all be packed beside j (their tokens plus j's exceed
// the capacity), j is never needed: any packing holding j leaves out some dominator d, and
// swapping j for d loses no value and needs no more room. Every swap moves to an item
// earlier in (tokens, rank) order, so swapping repeats only finitely often, and some
// optimal packing holds no dominated item: all of them can be removed at once. (Counting
// dominators is not enough: floor(capacity / t_j) of them fit beside j when they are
// lighter; it is their tokens that must overflow.)
//
// One pass in (tokens, rank) order with a Fenwick tree of token sums over rank positions:
// when j is reached, the tree holds exactly the items lighter than j or as light and
// earlier-ranked, and those with a score >= j's are a prefix of the rank order.
std::vector<char> dominated_items(const Pool& pool) {
  const std::size_t m = pool.size();
  std::vector<char> out(m, 0);
  // Last rank position with the same score as p (the pool is in rank order: score desc).
  std::vector<std::size_t> same_score_end(m);
  for (std::size_t p = m; p-- > 0;)
    same_score_end[p] = (p + 1 < m && pool.v[p + 1] == pool.v[p]) ? same_score_end[p + 1] : p;
  const std::vector<std::size_t> order = positions_by_tokens(pool);
  std::vector<std::int64_t> tree(m + 1, 0);  // token sums stay below 2**62 (kMaxTokens)
  for (std::size_t p : order) {
    std::int64_t dominators = 0;
    for (std::size_t k = same_score_end[p] + 1; k > 0; k &= k - 1) dominators += tree[k];
    if (dominators > pool.capacity - pool.t[p]) out[p] = 1;
    for (std::size_t k = p + 1; k <= m; k += k & (~k + 1)) tree[k] += pool.t[p];
  }
  return out;
}

// Bound fixing (Dembo and Hammer's reduction with the exact LP bound). Given `lb`, the
// value of a packing in hand: if the LP bound with item k forced in is below lb, no packing
// holding k beats what is in hand, so k is fixed out; if the bound with k forced out is
// below lb, k is fixed in. What remains free is the problem still to solve, with the
// capacity the fixed-in items leave (negative when they cannot all fit, and then nothing
// beats lb). Each bound is the LP over the density order without k, read off prefix sums
// in O(log m): removing k changes nothing when the LP at that capacity does not reach k,
// and otherwise equals the LP at a capacity larger by t_k, less v_k.
enum class Fix : std::int8_t { Out = 0, In = 1, Free = 2 };

struct Fixing {
  std::vector<Fix> state;  // per pool position
  std::int64_t residual = 0;
};

Fixing fix_by_bounds(const Pool& pool, double lb) {
  const std::size_t m = pool.size();
  std::vector<std::int64_t> pt(m + 1, 0);
  std::vector<double> pv(m + 1, 0.0);
  for (std::size_t k = 0; k < m; ++k) {
    pt[k + 1] = pt[k] + pool.t[pool.by_density[k]];
    pv[k + 1] = pv[k] + pool.v[pool.by_density[k]];
  }
  // Largest j with pt[j] <= cap (cap >= 0: every capacity asked for here is). The
  // capacities differ from the pool's by one item's tokens, so j is near the break item:
  // gallop out from it, then bisect, instead of bisecting the whole order each time.
  std::size_t brk = 0;
  while (brk < m && pt[brk + 1] <= pool.capacity) ++brk;
  auto last_within = [&](std::int64_t cap) {
    std::size_t lo = 0, hi = m + 1;  // pt[lo] <= cap < pt[hi], pt[m + 1] read as infinite
    if (pt[brk] <= cap) {
      lo = brk;
      for (std::size_t step = 1;; step *= 2) {
        if (lo + step > m) break;
        if (pt[lo + step] > cap) {
          hi = lo + step;
          break;
        }
        lo += step;
      }
    } else {
      hi = brk;
      for (std::size_t step = 1;; step *= 2) {
        if (step > hi) break;  // pt[0] = 0 <= cap
        if (pt[hi - step] <= cap) {
          lo = hi - step;
          break;
        }
        hi -= step;
      }
    }
    while (hi - lo > 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (pt[mid] <= cap)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  };
  auto lp = [&](std::int64_t cap) {
    const std::size_t j = last_within(cap);
    double bound = pv[j];
    if (j < m) {
      const std::size_t p = pool.by_density[j];
      bound += pool.v[p] * (static_cast<double>(cap - pt[j]) / static_cast<double>(pool.t[p]));
    }
    return bound;
  };
  auto lp_without = [&](std::size_t k, std::int64_t cap) {
    const std::size_t p = pool.by_density[k];
    return pt[k] < cap ? lp(cap + pool.t[p]) - pool.v[p] : lp(cap);
  };
  // Fix only on a clear margin: the prefix sums carry rounding of about m ulps of the
  // bound, and a packing better than lb by less than this is not worth a proof.
  const double scale = std::max(std::abs(lb), lp(pool.capacity));
  const double tol = (1e-12 + 4e-16 * static_cast<double>(m)) * scale;
  Fixing fx;
  fx.state.assign(m, Fix::Free);
  fx.residual = pool.capacity;
  for (std::size_t k = 0; k < m; ++k) {
    const std::size_t p = pool.by_density[k];
    if (pool.v[p] + lp_without(k, pool.capacity - pool.t[p]) < lb - tol) {
      fx.state[p] = Fix::Out;
    } else if (lp_without(k, pool.capacity) < lb - tol) {
      fx.state[p] = Fix::In;
      fx.residual -= pool.t[p];
    }
  }
  return fx;
}

// ---- step 3a: DP over token buckets -------------------------------------------------
// Weights and capacity are rounded to the nearest bucket (at least one bucket per item):
// the DP then sees the problem with unbiased error, and step 4 repairs the exact sum.
std::int64_t to_buckets(std::int64_t tokens, std::int64_t bucket) {
  const std::int64_t q = tokens / bucket;
  const std::int64_t r = tokens % bucket;
  return q + (r >= bucket - r ? 1 : 0);
}

// Row i only computes the capacities that can matter: at most the weight of items 0..i
// (above that every capacity has the same value, so the row is that value continued) and
// at least `width - 1` less the weight of the items after i (below that no capacity is
// ever reached back from the last row). On a set whose weight is a small multiple of the
// capacity this skips most of the table. Choice bits are stored for that band only.
//
// `round_up` rounds weights up instead (and the caller rounds the capacity down): every
// packing the table allows then fits exactly, at the price of a little unused room.
std::vector<char> dp_select(const std::vector<std::int64_t>& tokens, const std::vector<double>& values,
                            std::int64_t bucket, std::size_t width, bool round_up = false) {
  const std::size_t m = tokens.size();
  const std::size_t cap = width - 1;
  std::vector<std::size_t> weight(m);
  // Weights saturate at width: an item heavier than the capacity never fits either way,
  // and the suffix sums below stay far from overflow.
  for (std::size_t i = 0; i < m; ++i)
    weight[i] = static_cast<std::size_t>(std::min<std::int64_t>(
        static_cast<std::int64_t>(width),
        std::max<std::int64_t>(1, round_up ? (tokens[i] - 1) / bucket + 1 : to_buckets(tokens[i], bucket))));
  std::vector<std::size_t> after(m + 1, 0);  // weight of items i.. (saturating at width)
  for (std::size_t i = m; i-- > 0;) after[i] = std::min(width, after[i + 1] + weight[i]);
  std::vector<char> chosen(m, 0);
  if (after[0] <= cap) {  // in buckets everything fits: the DP would take it all
    std::fill(chosen.begin(), chosen.end(), char{1});
    return chosen;
  }
  std::vector<std::size_t> lo(m), hi(m), offset(m + 1, 0);
  for (std::size_t i = 0, before = 0; i < m; ++i) {
    before = std::min(width, before + weight[i]);
    hi[i] = std::min(cap, before);
    lo[i] = cap - std::min(cap, after[i + 1]);
    offset[i + 1] = offset[i] + (hi[i] / 8 - lo[i] / 8 + 1);
  }
  std::unique_ptr<std::uint8_t[]> choice(new std::uint8_t[offset[m]]);  // bit-packed, band only
  std::vector<double> prev(width, 0.0), cur(width, 0.0);
  std::vector<std::uint8_t> took((cap / 8 + 1) * 8, 0);
  std::size_t prev_hi = 0;  // prev holds capacities [.., prev_hi]; row -1 is all zeros

  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t wi = weight[i];
    const double vi = values[i];
    // Continue the previous row's last value up to this row's reach.
    std::fill(prev.begin() + static_cast<std::ptrdiff_t>(prev_hi) + 1,
              prev.begin() + static_cast<std::ptrdiff_t>(hi[i]) + 1, prev[prev_hi]);
    const std::size_t first = std::max(lo[i], wi);  // first capacity the item fits in
    const std::size_t copy_end = std::min(first, hi[i] + 1);
    std::copy(prev.begin() + static_cast<std::ptrdiff_t>(lo[i]), prev.begin() + static_cast<std::ptrdiff_t>(copy_end),
              cur.begin() + static_cast<std::ptrdiff_t>(lo[i]));
    std::fill(took.begin() + static_cast<std::ptrdiff_t>(lo[i]), took.begin() + static_cast<std::ptrdiff_t>(copy_end),
              std::uint8_t{0});
    // Separate input and output rows keep both loops free of carried dependencies, so
    // the compiler vectorizes them (a max, then a compare narrowed to bytes).
    const double* __restrict p = prev.data();
    double* __restrict c = cur.data();
    std::uint8_t* __restrict k = took.data();
    const std::size_t end = hi[i] + 1;
    for (std::size_t w = first; w < end; ++w) c[w] = std::max(p[w], p[w - wi] + vi);
    for (std::size_t w = first; w < end; ++w) k[w] = static_cast<std::uint8_t>(c[w] > p[w]);
    // Pack eight 0/1 bytes into one bit-row byte: the multiply gathers byte j's low bit
    // into bit 56 + j, with no carries between the eight products. Bits outside the band
    // come from stale (initialized) bytes and are never read.
    std::uint8_t* row = choice.get() + offset[i];
    for (std::size_t byte = lo[i] / 8, out = 0; byte <= hi[i] / 8; ++byte, ++out) {
      std::uint64_t eight;
      std::memcpy(&eight, took.data() + byte * 8, 8);
      row[out] = static_cast<std::uint8_t>((eight * 0x0102040810204080ULL) >> 56);
    }
    std::swap(prev, cur);
    prev_hi = hi[i];
  }

  std::size_t w = cap;
  for (std::size_t i = m; i-- > 0;) {
    const std::uint8_t* row = choice.get() + offset[i];
    const std::size_t bit = w - (lo[i] / 8) * 8;
    if ((static_cast<unsigned>(row[bit / 8]) >> (bit % 8)) & 1U) {
      chosen[i] = 1;
      w -= weight[i];
    }
    // Above the previous row's reach its value is constant: go down to where it was stored.
    if (i > 0) w = std::min(w, hi[i - 1]);
  }
  return chosen;
}

// ---- step 4, sparse: the exact DP over Pareto states ---------------------------------
// Nemhauser and Ullmann: after each item, keep only the (tokens, value) states no other
// state beats on both, in ascending tokens with strictly rising value. With items that
// are large against the capacity there are few such states (a packing holds a handful of
// items), where a table on exact token counts has capacity + 1 cells a row. Exact; gives
// up (returns false) once more than `state_limit` states would be stored.
bool pareto_select(const Pool& pool, std::int64_t state_limit, std::vector<char>& chosen) {
  struct State {
    std::int64_t w;
    double v;
    std::uint32_t from;  // index in the previous item's list
    bool took;
  };
  const std::size_t m = pool.size();
  std::vector<std::vector<State>> lists(m + 1);
  lists[0].push_back({0, 0.0, 0, false});
  std::int64_t stored = 1;
  for (std::size_t i = 0; i < m; ++i) {
    const std::vector<State>& prev = lists[i];
    std::vector<State>& next = lists[i + 1];
    next.reserve(prev.size() * 2);
    const std::int64_t ti = pool.t[i];
    const double vi = pool.v[i];
    std::size_t a = 0, b = 0;  // a: prev without item i; b: prev with item i
    double last = -1.0;        // values are > 0 but the empty state's is 0
    while (a < prev.size() || b < prev.size()) {
      const bool b_ok = b < prev.size() && prev[b].w + ti <= pool.capacity;
      if (!b_ok) b = prev.size();
      State s;
      if (b == prev.size() || (a < prev.size() && prev[a].w <= prev[b].w + ti)) {
        if (a == prev.size()) break;
        s = {prev[a].w, prev[a].v, static_cast<std::uint32_t>(a), false};
        ++a;
      } else {
        s = {prev[b].w + ti, prev[b].v + vi, static_cast<std::uint32_t>(b), true};
        ++b;
      }
      if (s.v > last) {
        if (!next.empty() && next.back().w == s.w)
          next.back() = s;  // same tokens, more value
        else
          next.push_back(s);
        last = s.v;
      }
    }
    stored += static_cast<std::int64_t>(next.size());
    if (stored > state_limit || next.size() > std::numeric_limits<std::uint32_t>::max()) return false;
  }
  chosen.assign(m, 0);
  std::size_t k = lists[m].size() - 1;  // the last state has the largest value
  for (std::size_t i = m; i > 0; --i) {
    const State& s = lists[i][k];
    chosen[i - 1] = s.took ? 1 : 0;
    k = s.from;
  }
  return true;
}

// ---- step 3b: the fallback above the cell ceiling -----------------------------------
// Value-density greedy that keeps scanning past items that do not fit, compared with the
// single most valuable item (the classic guard that makes density greedy a 1/2
// approximation); steps 4-5 then improve it. A score-descending greedy is not used: it
// fills the budget with large high-score items and loses most of the achievable value.
std::vector<char> greedy_select(const Pool& pool) {
  std::vector<char> chosen(pool.size(), 0);
  std::int64_t room = pool.capacity;
  double value = 0.0;
  for (std::size_t p : pool.by_density) {
    if (pool.t[p] <= room) {
      chosen[p] = 1;
      room -= pool.t[p];
      value += pool.v[p];
    }
  }
  std::size_t best_single = 0;
  for (std::size_t p = 1; p < pool.size(); ++p)
    if (pool.v[p] > pool.v[best_single]) best_single = p;
  if (pool.size() > 0 && pool.v[best_single] > value) {
    std::fill(chosen.begin(), chosen.end(), 0);
    chosen[best_single] = 1;
  }
  return chosen;
}

// ---- step 4: exact repair -----------------------------------------------------------
// Bucket rounding can overshoot the exact capacity. Two ways back under it; keep the one
// that gives up less score: drop the cheapest single item that covers the excess, or drop
// items in ascending density until the sum fits.
void repair(const Pool& pool, std::vector<char>& chosen) {
  std::int64_t used = chosen_tokens(pool, chosen);
  if (used <= pool.capacity) return;
  const std::int64_t excess = used - pool.capacity;

  std::size_t single = pool.size();
  for (std::size_t p = 0; p < pool.size(); ++p) {
    if (chosen[p] && pool.t[p] >= excess && (single == pool.size() || pool.v[p] < pool.v[single])) single = p;
  }
  double single_loss = single < pool.size() ? pool.v[single] : std::numeric_limits<double>::infinity();

  std::vector<std::size_t> drops;
  double drop_loss = 0.0;
  std::int64_t after = used;
  for (auto it = pool.by_density.rbegin(); it != pool.by_density.rend() && after > pool.capacity; ++it) {
    if (!chosen[*it]) continue;
    drops.push_back(*it);
    drop_loss += pool.v[*it];
    after -= pool.t[*it];
  }
  if (single_loss <= drop_loss) {
    chosen[single] = 0;
  } else {
    for (std::size_t p : drops) chosen[p] = 0;
  }
}

// ---- step 5: refill and local improvement -------------------------------------------
void refill(const Pool& pool, std::vector<char>& chosen) {
  std::int64_t room = pool.capacity - chosen_tokens(pool, chosen);
  for (std::size_t p : pool.by_density) {
    if (!chosen[p] && pool.t[p] <= room) {
      chosen[p] = 1;
      room -= pool.t[p];
    }
  }
}

double chosen_value(const Pool& pool, const std::vector<char>& chosen) {
  // Branch-free, and the same sum: adding 0.0 to a sum of positive scores changes no bit.
  double sum = 0.0;
  for (std::size_t p = 0; p < pool.size(); ++p) sum += chosen[p] != 0 ? pool.v[p] : 0.0;
  return sum;
}

// Exact DP on exact token counts over a window ("core") of items around the break item
// of the density order: items before the window are fixed in, items after it fixed out.
// Optimal knapsack solutions almost always differ from the density greedy only near the
// break, and there bucket rounding is what costs value, so this recovers it exactly. The
// window grows on both sides while its table stays within `cell_limit` cells.
bool core_improve(const Pool& pool, std::vector<char>& chosen, std::int64_t cell_limit) {
  const std::size_t m = pool.size();
  std::vector<std::int64_t> prefix(m + 1, 0);
  for (std::size_t k = 0; k < m; ++k) prefix[k + 1] = prefix[k] + pool.t[pool.by_density[k]];
  std::size_t brk = 0;
  while (brk < m && prefix[brk + 1] <= pool.capacity) ++brk;
  if (brk == m) return false;  // everything fits: nothing to improve
  // (hi - lo) x (room + 1) <= cell_limit, written so that it cannot overflow.
  auto fits = [&](std::size_t lo, std::size_t hi) {
    return pool.capacity - prefix[lo] + 1 <= cell_limit / static_cast<std::int64_t>(hi - lo);
  };
  std::size_t lo = brk, hi = brk + 1;
  if (!fits(lo, hi)) return false;
  for (bool grew = true; grew;) {
    grew = false;
    if (hi < m && fits(lo, hi + 1)) {
      ++hi;
      grew = true;
    }
    if (lo > 0 && fits(lo - 1, hi)) {
      --lo;
      grew = true;
    }
  }
  std::vector<std::int64_t> t;
  std::vector<double> v;
  for (std::size_t k = lo; k < hi; ++k) {
    t.push_back(pool.t[pool.by_density[k]]);
    v.push_back(pool.v[pool.by_density[k]]);
  }
  const std::int64_t room = pool.capacity - prefix[lo];
  const std::vector<char> window = dp_select(t, v, 1, static_cast<std::size_t>(room) + 1);
  std::vector<char> candidate(m, 0);
  for (std::size_t k = 0; k < lo; ++k) candidate[pool.by_density[k]] = 1;
  for (std::size_t k = lo; k < hi; ++k) candidate[pool.by_density[k]] = window[k - lo];
  const double before = chosen_value(pool, chosen);
  const double after = chosen_value(pool, candidate);
  if (!(after > before + 1e-12 * std::abs(before))) return false;
  chosen.swap(candidate);
  return true;
}

// Best 1-for-1 swap: for each chosen item, the most valuable unchosen item that fits in its
// tokens plus the slack (a prefix maximum over unchosen items sorted by tokens).
bool best_swap(const Pool& pool, std::vector<char>& chosen) {
  const std::int64_t slack = pool.capacity - chosen_tokens(pool, chosen);
  std::vector<std::size_t> out;  // unchosen, ascending tokens: a filter of the presorted order
  for (std::size_t p : pool.by_tokens)
    if (!chosen[p]) out.push_back(p);
  if (out.empty()) return false;
  std::vector<std::size_t> best_upto(out.size());
  for (std::size_t k = 0; k < out.size(); ++k) {
    best_upto[k] = (k == 0 || pool.v[out[k]] > pool.v[best_upto[k - 1]]) ? out[k] : best_upto[k - 1];
  }
  double best_gain = 0.0;
  std::size_t drop = pool.size(), add = pool.size();
  for (std::size_t p = 0; p < pool.size(); ++p) {
    if (!chosen[p]) continue;
    const std::int64_t limit = pool.t[p] + slack;
    auto end = std::upper_bound(out.begin(), out.end(), limit,
                                [&](std::int64_t lim, std::size_t q) { return lim < pool.t[q]; });
    if (end == out.begin()) continue;
    const std::size_t q = best_upto[static_cast<std::size_t>(end - out.begin()) - 1];
    const double gain = pool.v[q] - pool.v[p];
    if (gain > best_gain) {
      best_gain = gain;
      drop = p;
      add = q;
    }
  }
  if (drop == pool.size()) return false;
  chosen[drop] = 0;
  chosen[add] = 1;
  return true;
}

// Depth-first branch-and-bound over items in density order (Horowitz and Sahni), seeded
// with the current selection as the incumbent and stopped after `limit` nodes. It only ever replaces the incumbent with
// a strictly better feasible set; when it finishes inside the limit the result is a proven optimum. `floor` is a value
// some packing outside this pool's scope already reaches (the caller keeps that packing): the search then only looks
// for packings above it.
struct SearchOutcome {
  bool complete = false;
  std::int64_t nodes = 0;
};

// Grouped (kGrouped): an item is only taken while no other member of its group is, and
// the "everything left fits" shortcut is off (taking everything would break a group); the
// bound, which ignores groups, still bounds every packing below a node.
template <bool kGrouped>
SearchOutcome search(const Pool& pool, std::vector<char>& chosen, std::int64_t limit, double floor) {
  SearchOutcome out;
  const std::size_t m = pool.size();
  if (limit <= 0 || m == 0) {
    out.complete = (m == 0);
    return out;
  }
  std::vector<std::int64_t> dt(m), pt(m + 1, 0);
  std::vector<double> dv(m), pv(m + 1, 0.0);
  std::vector<std::uint32_t> dg(kGrouped ? m : 0);
  std::vector<char> used(kGrouped ? pool.groups : 0, 0);  // group holds a taken item
  for (std::size_t k = 0; k < m; ++k) {
    const std::size_t p = pool.by_density[k];
    dt[k] = pool.t[p];
    dv[k] = pool.v[p];
    if constexpr (kGrouped) dg[k] = pool.group[p];
    pt[k + 1] = pt[k] + dt[k];
    pv[k + 1] = pv[k] + dv[k];
  }
  // Incumbent summed in the same (density) order the search sums in, so an equal set
  // never looks like an improvement.
  std::vector<char> best_x(m, 0);
  double best = 0.0;
  for (std::size_t k = 0; k < m; ++k) {
    if (chosen[pool.by_density[k]]) {
      best_x[k] = 1;
      best += dv[k];
    }
  }
  best = std::max(best, floor);
  const double tol = 1e-12 * pv[m];

  auto lp = [&](std::size_t k, std::int64_t cap) {
    // Largest j with pt[j] - pt[k] <= cap: items k..j-1 fit whole, j is the break item.
    const auto it = std::upper_bound(pt.begin() + static_cast<std::ptrdiff_t>(k), pt.end(), pt[k] + cap);
    const std::size_t j = static_cast<std::size_t>(it - pt.begin()) - 1;
    double bound = pv[j] - pv[k];
    if (j == m) return bound;
    // Martello and Toth's bound, never above the LP's: the break item is either out (the
    // room left filled at the next item's density) or in (the room it lacks taken back at
    // the previous item's density). Much tighter than the LP when items are large.
    const double room = static_cast<double>(cap - (pt[j] - pt[k]));
    const double out = j + 1 < m ? room * (dv[j + 1] / static_cast<double>(dt[j + 1])) : 0.0;
    const double in = j > k ? dv[j] - (static_cast<double>(dt[j]) - room) * (dv[j - 1] / static_cast<double>(dt[j - 1]))
                            : -std::numeric_limits<double>::infinity();
    return bound + std::max(out, in);
  };

  struct Frame {
    std::size_t k;
    std::int64_t cap;
    double val;
    std::uint8_t stage;  // 0: enter, 1: include branch done, 2: both done
  };
  std::vector<Frame> stack;
  stack.reserve(m + 2);
  stack.push_back({0, pool.capacity, 0.0, 0});
  std::vector<char> x(m, 0);
  bool improved = false;
  auto record = [&](std::size_t k, double val, bool rest_taken) {
    best = val;
    std::copy(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(k), best_x.begin());
    std::fill(best_x.begin() + static_cast<std::ptrdiff_t>(k), best_x.end(), rest_taken ? 1 : 0);
    improved = true;
  };

  out.complete = true;
  while (!stack.empty()) {
    const Frame f = stack.back();
    if (f.stage == 0) {
      if (out.nodes >= limit) {
        out.complete = false;
        break;
      }
      ++out.nodes;
      if (f.val > best + tol) record(f.k, f.val, false);
      if (f.k == m) {
        stack.pop_back();
        continue;
      }
      if (!kGrouped && pt[m] - pt[f.k] <= f.cap) {  // everything left fits: this subtree's best leaf
        const double all = f.val + (pv[m] - pv[f.k]);
        if (all > best + tol) record(f.k, all, true);
        stack.pop_back();
        continue;
      }
      if (f.val + lp(f.k, f.cap) <= best + tol) {
        stack.pop_back();
        continue;
      }
      stack.back().stage = 1;
      bool open = dt[f.k] <= f.cap;
      if constexpr (kGrouped) open = open && !used[dg[f.k]];
      if (open) {
        x[f.k] = 1;
        if constexpr (kGrouped) used[dg[f.k]] = 1;
        stack.push_back({f.k + 1, f.cap - dt[f.k], f.val + dv[f.k], 0});
        continue;
      }
    }
    Frame& g = stack.back();
    if (g.stage == 1) {
      if constexpr (kGrouped)
        if (x[g.k]) used[dg[g.k]] = 0;
      x[g.k] = 0;
      g.stage = 2;
      const Frame child{g.k + 1, g.cap, g.val, 0};
      stack.push_back(child);
      continue;
    }
    stack.pop_back();
  }
  if (improved) {
    std::fill(chosen.begin(), chosen.end(), 0);
    for (std::size_t k = 0; k < m; ++k)
      if (best_x[k]) chosen[pool.by_density[k]] = 1;
  }
  return out;
}

SearchOutcome branch_and_bound(const Pool& pool, std::vector<char>& chosen, std::int64_t limit, double floor) {
  return search<false>(pool, chosen, limit, floor);
}

// Steps 4-6 on the pool that dominance leaves, whose tokens exceed its capacity (density
// order set). Leaves the best packing found in `best` (pool positions) and fills the
// record's path, dp_cells, search_nodes, free_items and proven_optimal.
//
// The bar is the value-density packing, improved by a small exact DP around its break
// item; bound fixing against it leaves the free items. A DP over them (exact when its table
// is small, and then the answer) raises the bar, and fixing again against the higher bar
// usually leaves few enough for the exact DP; otherwise the exact core, swaps and the
// bounded search finish the job on what is still free.
void solve_reduced(const Pool& red, const PackOptions& options, std::vector<char>& best, PackResult& res) {
  const bool dp_path = res.path == PackPath::Dp;
  best = greedy_select(red);
  refill(red, best);
  if (core_improve(red, best, std::min(kBarCells, options.core_cell_limit))) refill(red, best);
  double bar = chosen_value(red, best);
  bool bucket_dp_done = false, fine_dp_done = false;
  for (int round = 1;; ++round) {
    const Fixing fx = fix_by_bounds(red, bar);
    if (fx.residual < 0) {
      res.proven_optimal = true;  // the items fixed in cannot all fit: nothing beats the bar
      return;
    }
    std::vector<char> fixed(red.size(), 0), free_mask(red.size(), 0);
    for (std::size_t p = 0; p < red.size(); ++p) {
      if (fx.state[p] == Fix::In)
        fixed[p] = 1;
      else if (fx.state[p] == Fix::Free && red.t[p] <= fx.residual)
        free_mask[p] = 1;
    }
    Pool sub = subset(red, free_mask, fx.residual);
    res.free_items = static_cast<std::int64_t>(sub.size());
    const double fixed_value = chosen_value(red, fixed);
    // The fixed-in items plus a packing of the free ones; kept when it beats the bar.
    auto lift = [&](const std::vector<char>& sub_chosen) {
      std::vector<char> cand = fixed;
      for (std::size_t p = 0, q = 0; p < red.size(); ++p)
        if (free_mask[p]) cand[p] = sub_chosen[q++];
      const double value = chosen_value(red, cand);
      if (!(value > bar)) return false;
      best.swap(cand);
      bar = value;
      return true;
    };
    if (std::accumulate(sub.t.begin(), sub.t.end(), std::int64_t{0}) <= sub.capacity) {
      lift(std::vector<char>(sub.size(), 1));  // every free item fits: that is the optimum
      res.proven_optimal = true;
      return;
    }
    const auto m = static_cast<std::int64_t>(sub.size());
    const std::int64_t room = sub.capacity;
    const bool exact_in_core = room + 1 <= options.core_cell_limit / m;
    const bool exact_in_ceiling = dp_path && room + 1 <= options.cell_ceiling / m;
    const std::int64_t lightest = *std::min_element(sub.t.begin(), sub.t.end());
    if (!exact_in_core && lightest > room / kParetoMaxFit) {
      // Few Pareto states (large items: at most kParetoMaxFit of them fit): the free items'
      // exact optimum for much less work than the table. Tried within the step's cell
      // budget, and given up early when the states would cost a good part of the table.
      std::int64_t state_limit =
          dp_path ? std::max(options.core_cell_limit, options.cell_ceiling / 4) : options.core_cell_limit;
      if (room + 1 <= std::numeric_limits<std::int64_t>::max() / (4 * m))
        state_limit = std::min(state_limit, (room + 1) * m / 4);
      std::vector<char> exact;
      if (pareto_select(sub, state_limit, exact)) {
        lift(exact);
        res.proven_optimal = true;
        return;
      }
    }
    if (exact_in_core || exact_in_ceiling) {
      // Small enough for the DP on exact token counts: the free items' optimum. On the DP
      // path, 1-token buckets whenever that table fits under the ceiling; on the fallback
      // path, the exact core step covering every free item.
      if (dp_path) res.dp_cells += (room + 1) * m;
      lift(dp_select(sub.t, sub.v, 1, static_cast<std::size_t>(room + 1)));
      res.proven_optimal = true;
      return;
    }
    order_by_density(sub);
    if (dp_path && !bucket_dp_done) {
      bucket_dp_done = true;
      const std::int64_t width = to_buckets(room, options.bucket_tokens) + 1;
      {
        res.dp_cells += width * m;
        std::vector<char> chosen = dp_select(sub.t, sub.v, options.bucket_tokens, static_cast<std::size_t>(width));
        repair(sub, chosen);
        refill(sub, chosen);
        if (lift(chosen)) continue;  // a higher bar fixes more: reduce again
      }
    }
    // Improve from the best packing when it is one of this sub-problem's (it holds every
    // fixed-in item and no fixed-out one), else from the free items' density packing.
    order_by_tokens(sub);
    bool consistent = true;
    for (std::size_t p = 0; p < red.size() && consistent; ++p) consistent = free_mask[p] || best[p] == fixed[p];
    std::vector<char> chosen;
    if (consistent) {
      for (std::size_t p = 0; p < red.size(); ++p)
        if (free_mask[p]) chosen.push_back(best[p]);
    } else {
      chosen = greedy_select(sub);
      refill(sub, chosen);
    }
    // Once: a DP over every free item in the core step's cell budget, with the finest
    // buckets that allow (on the DP path, only when finer than the step-4 buckets). With
    // few free items this is near exact where the exact window holds only a handful.
    const std::int64_t per_item = options.core_cell_limit / m;
    if (!fine_dp_done && per_item >= 2) {
      fine_dp_done = true;
      // Weights rounded up, capacity down: what it picks fits exactly, so no repair (which
      // drops a whole item, a large loss when items are large) is needed.
      const std::int64_t bucket = room / (per_item - 1) + 1;
      if (!dp_path || bucket < options.bucket_tokens) {
        std::vector<char> fine =
            dp_select(sub.t, sub.v, bucket, static_cast<std::size_t>(room / bucket + 1), /*round_up=*/true);
        refill(sub, fine);
        if (chosen_value(sub, fine) > chosen_value(sub, chosen)) chosen.swap(fine);
      }
    }
    if (core_improve(sub, chosen, options.core_cell_limit)) refill(sub, chosen);
    for (int s = 0; s < kMaxSwaps && best_swap(sub, chosen); ++s) refill(sub, chosen);
    if (lift(chosen) && round < kMaxFixRounds) continue;  // a higher bar: fix again
    const SearchOutcome search = branch_and_bound(sub, chosen, options.search_node_limit, bar - fixed_value);
    res.search_nodes = search.nodes;
    res.proven_optimal = search.complete;
    repair(sub, chosen);  // a no-op by construction; the budget guarantee does not rest on it
    lift(chosen);
    return;
  }
}

// Steps 3-6 on a pool of non-pinned, positive, 0 < tokens <= capacity items in rank order
// (no groups): the exact reductions, then the DP or the fallback, then repair, refill
// and improvement. Returns the packing (pool positions), sets `pool_bound` to the LP bound
// on the pool's optimum and fills the record's path, dp_cells, search_nodes, dominated,
// free_items and proven_optimal.
std::vector<char> solve_pool(const Pool& pool, const PackOptions& options, PackResult& res, double& pool_bound) {
  std::vector<char> chosen(pool.size(), 1);
  pool_bound = std::accumulate(pool.v.begin(), pool.v.end(), 0.0);  // when everything fits
  if (std::accumulate(pool.t.begin(), pool.t.end(), std::int64_t{0}) <= pool.capacity) {
    res.path = PackPath::Trivial;
    res.proven_optimal = true;
    return chosen;
  }
  // Step 3: exact reductions. Dominated items are left out for good: never needed.
  const std::vector<char> dominated = dominated_items(pool);
  std::vector<char> kept(pool.size());
  for (std::size_t p = 0; p < pool.size(); ++p) kept[p] = static_cast<char>(!dominated[p]);
  Pool red = subset(pool, kept, pool.capacity);
  res.dominated += static_cast<std::int64_t>(pool.size() - red.size());
  // Step 4's decision, on the reduced set: the DP while its table stays under the ceiling.
  const std::int64_t width = to_buckets(red.capacity, options.bucket_tokens) + 1;
  const bool dp = width <= options.cell_ceiling / static_cast<std::int64_t>(std::max<std::size_t>(1, red.size()));
  res.path = dp ? PackPath::Dp : PackPath::Greedy;
  std::vector<char> best(red.size(), 1);
  if (std::accumulate(red.t.begin(), red.t.end(), std::int64_t{0}) <= red.capacity) {
    res.proven_optimal = true;  // what dominance leaves fits whole: that is an optimum
    pool_bound = std::accumulate(red.v.begin(), red.v.end(), 0.0);
  } else {
    order_by_density(red);
    pool_bound = lp_bound(red);
    solve_reduced(red, options, best, res);
    refill(red, best);  // a no-op on an optimum; keeps every packing maximal
  }
  // Back to pool positions; then, so that nothing left out still fits, dominated items
  // into any room left (only possible when the packing was not proven optimal).
  std::fill(chosen.begin(), chosen.end(), char{0});
  std::int64_t used = 0;
  for (std::size_t p = 0, q = 0; p < pool.size(); ++p) {
    if (!kept[p]) continue;
    chosen[p] = best[q++];
    if (chosen[p]) used += pool.t[p];
  }
  for (std::size_t p = 0; p < pool.size(); ++p) {
    if (!kept[p] && pool.t[p] <= pool.capacity - used) {
      chosen[p] = 1;
      used += pool.t[p];
    }
  }
  return chosen;
}

// ---- groups: the multiple-choice knapsack -----------------------------------------
// With groups every pool item carries its group's compact id (Pool::group), and every
// packing built below holds at most one item of each group. Bound fixing and the upper
// bound use the multiple-choice LP (hull_segments); the search prunes with the 0/1 LP of
// the steps above, which ignores groups: a bound on a relaxation is still a bound, only a
// weaker one where a group holds several dense items.

Pool grouped_subset(const Pool& pool, const std::vector<char>& keep, std::int64_t capacity) {
  Pool out = subset(pool, keep, capacity);
  out.groups = pool.groups;
  out.group.reserve(out.size());
  for (std::size_t p = 0; p < pool.size(); ++p)
    if (keep[p]) out.group.push_back(pool.group[p]);
  return out;
}

std::vector<char> taken_groups(const Pool& pool, const std::vector<char>& chosen) {
  std::vector<char> taken(pool.groups, 0);
  for (std::size_t p = 0; p < pool.size(); ++p)
    if (chosen[p]) taken[pool.group[p]] = 1;
  return taken;
}

// Within a group, an item preceded in (tokens ascending, rank) order by a member of at
// least its score is never needed: swapping it for that member keeps the group's one
// item, needs no more room and loses no value. Marks the items kept.
std::vector<char> undominated_in_groups(const Pool& pool) {
  const std::size_t m = pool.size();
  const std::vector<std::size_t> by_t = positions_by_tokens(pool);
  std::vector<std::uint32_t> key(m);
  for (std::size_t k = 0; k < m; ++k) key[k] = pool.group[by_t[k]];
  const std::vector<std::size_t> by_group = stable_order(key);  // positions in by_t
  std::vector<char> keep(m, 0);
  double best = 0.0;
  for (std::size_t k = 0; k < m; ++k) {
    const std::size_t p = by_t[by_group[k]];
    if (k == 0 || key[by_group[k]] != key[by_group[k - 1]]) best = 0.0;  // a new group (scores are > 0)
    if (pool.v[p] > best) {
      keep[p] = 1;
      best = pool.v[p];
    }
  }
  return keep;
}

// Value-density greedy that skips items whose group is taken, against the most valuable
// single item (the same 1/2-approximation guard as greedy_select).
std::vector<char> grouped_greedy(const Pool& pool) {
  std::vector<char> chosen(pool.size(), 0), taken(pool.groups, 0);
  std::int64_t room = pool.capacity;
  double value = 0.0;
  for (std::size_t p : pool.by_density) {
    if (pool.t[p] <= room && !taken[pool.group[p]]) {
      chosen[p] = 1;
      taken[pool.group[p]] = 1;
      room -= pool.t[p];
      value += pool.v[p];
    }
  }
  std::size_t best_single = 0;
  for (std::size_t p = 1; p < pool.size(); ++p)
    if (pool.v[p] > pool.v[best_single]) best_single = p;
  if (pool.size() > 0 && pool.v[best_single] > value) {
    std::fill(chosen.begin(), chosen.end(), 0);
    chosen[best_single] = 1;
  }
  return chosen;
}

void grouped_refill(const Pool& pool, std::vector<char>& chosen) {
  std::vector<char> taken = taken_groups(pool, chosen);
  std::int64_t room = pool.capacity - chosen_tokens(pool, chosen);
  for (std::size_t p : pool.by_density) {
    if (!chosen[p] && pool.t[p] <= room && !taken[pool.group[p]]) {
      chosen[p] = 1;
      taken[pool.group[p]] = 1;
      room -= pool.t[p];
    }
  }
}

// Best 1-for-1 swap that keeps one item per group: for each chosen item, the most valuable
// unchosen item that fits in its tokens plus the slack, among the items of untaken groups
// (a prefix maximum over them by tokens) and the other members of its own group.
bool grouped_swap(const Pool& pool, std::vector<char>& chosen) {
  const std::size_t none = pool.size();
  const std::int64_t slack = pool.capacity - chosen_tokens(pool, chosen);
  std::vector<std::size_t> holder(pool.groups, none);  // the chosen item of each group
  for (std::size_t p = 0; p < pool.size(); ++p)
    if (chosen[p]) holder[pool.group[p]] = p;
  std::vector<std::size_t> out;  // unchosen, of untaken groups, ascending tokens
  for (std::size_t p : pool.by_tokens)
    if (holder[pool.group[p]] == none) out.push_back(p);
  std::vector<std::size_t> best_upto(out.size());
  for (std::size_t k = 0; k < out.size(); ++k)
    best_upto[k] = (k == 0 || pool.v[out[k]] > pool.v[best_upto[k - 1]]) ? out[k] : best_upto[k - 1];
  double best_gain = 0.0;
  std::size_t drop = none, add = none;
  auto consider = [&](std::size_t p, std::size_t q) {
    const double gain = pool.v[q] - pool.v[p];
    if (gain > best_gain) {
      best_gain = gain;
      drop = p;
      add = q;
    }
  };
  for (std::size_t p = 0; p < pool.size(); ++p) {
    if (!chosen[p]) continue;
    const std::int64_t limit = pool.t[p] + slack;
    auto end = std::upper_bound(out.begin(), out.end(), limit,
                                [&](std::int64_t lim, std::size_t q) { return lim < pool.t[q]; });
    if (end != out.begin()) consider(p, best_upto[static_cast<std::size_t>(end - out.begin()) - 1]);
  }
  for (std::size_t q = 0; q < pool.size(); ++q) {  // within a taken group: trade its item
    const std::size_t p = holder[pool.group[q]];
    if (p != none && p != q && pool.t[q] <= pool.t[p] + slack) consider(p, q);
  }
  if (drop == none) return false;
  chosen[drop] = 0;
  chosen[add] = 1;
  return true;
}

// The DP over groups (the multiple-choice knapsack): one row per group, each capacity
// the best of taking none of the group and of each member on the row before the group.
// Weights in buckets as dp_select's (nearest, at least one; or rounded up with
// `round_up`, the caller rounding the capacity down). The choice table holds the member
// taken (1-based within the group, 0 for none) per group and capacity.
std::vector<char> grouped_dp_select(const Pool& pool, std::int64_t bucket, std::size_t width, bool round_up = false) {
  const std::size_t m = pool.size();
  const std::size_t cap = width - 1;
  std::vector<std::size_t> weight(m);
  for (std::size_t i = 0; i < m; ++i)
    weight[i] = static_cast<std::size_t>(std::min<std::int64_t>(
        static_cast<std::int64_t>(width),
        std::max<std::int64_t>(1, round_up ? (pool.t[i] - 1) / bucket + 1 : to_buckets(pool.t[i], bucket))));
  const std::vector<std::size_t> members = stable_order(pool.group);  // grouped, rank order within
  std::vector<std::size_t> starts;
  for (std::size_t k = 0; k < m; ++k)
    if (k == 0 || pool.group[members[k]] != pool.group[members[k - 1]]) starts.push_back(k);
  starts.push_back(m);
  const std::size_t rows = starts.size() - 1;
  std::vector<std::uint32_t> choice(rows * width, 0);
  std::vector<double> prev(width, 0.0), cur(width, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy(prev.begin(), prev.end(), cur.begin());
    std::uint32_t* ch = choice.data() + r * width;
    for (std::size_t k = starts[r]; k < starts[r + 1]; ++k) {
      const std::size_t wi = weight[members[k]];
      if (wi > cap) continue;
      const double vi = pool.v[members[k]];
      const auto tag = static_cast<std::uint32_t>(k - starts[r] + 1);
      for (std::size_t w = wi; w <= cap; ++w) {
        const double c = prev[w - wi] + vi;
        if (c > cur[w]) {
          cur[w] = c;
          ch[w] = tag;
        }
      }
    }
    std::swap(prev, cur);
  }
  std::vector<char> chosen(m, 0);
  std::size_t w = cap;
  for (std::size_t r = rows; r-- > 0;) {
    const std::uint32_t tag = choice[r * width + w];
    if (tag == 0) continue;
    const std::size_t p = members[starts[r] + tag - 1];
    chosen[p] = 1;
    w -= weight[p];
  }
  return chosen;
}

// The LP relaxation of the multiple-choice knapsack (Sinha and Zoltners): each group's
// members, with the empty choice at (0, 0), reduced to the upper convex hull of their
// (tokens, score) points; the hull's edges are "segments" whose densities fall along the
// hull, so the greedy fractional packing of all segments by density takes each group's
// segments in order, and its value is the LP optimum. Far tighter than the 0/1 LP when a
// group holds several dense near-copies (that LP takes them all).
struct Segments {
  std::vector<std::int64_t> pt;  // prefix sums of tokens over segments in density order
  std::vector<double> pv;        // prefix sums of value
  std::vector<std::int64_t> dt;  // each segment's tokens, density order
  std::vector<double> dv;
  std::vector<std::size_t> at;    // per pool item: its segment's density position, or m when it is no
                                  // singleton (only singletons' segments are removed one at a time)
  std::vector<std::size_t> to;    // per segment (density order): the hull vertex it ends at
  std::vector<std::size_t> from;  // the vertex it starts at, or m for the empty choice

  // The LP over every segment at capacity `cap` (>= 0).
  double lp(std::int64_t cap) const {
    const std::size_t s = dt.size();
    const auto it = std::upper_bound(pt.begin(), pt.end(), cap);
    const std::size_t j = static_cast<std::size_t>(it - pt.begin()) - 1;
    double bound = pv[j];
    if (j < s) bound += dv[j] * (static_cast<double>(cap - pt[j]) / static_cast<double>(dt[j]));
    return bound;
  }
  // The LP without segment k (a singleton's) at capacity `cap`: as fix_by_bounds's.
  double lp_without(std::size_t k, std::int64_t cap) const { return pt[k] < cap ? lp(cap + dt[k]) - dv[k] : lp(cap); }
};

Segments hull_segments(const Pool& pool) {
  const std::size_t m = pool.size();
  const std::vector<std::size_t> by_t = positions_by_tokens(pool);
  std::vector<std::uint32_t> key(m);
  for (std::size_t k = 0; k < m; ++k) key[k] = pool.group[by_t[k]];
  const std::vector<std::size_t> by_group = stable_order(key);
  std::vector<std::int64_t> seg_t;
  std::vector<double> seg_v;
  std::vector<std::size_t> seg_item;  // the singleton item of a segment, or m
  std::vector<std::size_t> seg_to, seg_from;
  std::vector<std::size_t> hull;  // pool positions of the current group's hull vertices
  for (std::size_t a = 0; a < m;) {
    std::size_t b = a + 1;
    while (b < m && key[by_group[b]] == key[by_group[a]]) ++b;
    hull.clear();
    // Members by ascending tokens; undominated_in_groups left strictly rising scores.
    for (std::size_t k = a; k < b; ++k) {
      const std::size_t p = by_t[by_group[k]];
      while (!hull.empty()) {
        const std::size_t q = hull.back();
        const std::int64_t t0 = hull.size() > 1 ? pool.t[hull[hull.size() - 2]] : 0;
        const double v0 = hull.size() > 1 ? pool.v[hull[hull.size() - 2]] : 0.0;
        // q is under (or on) the chord from the vertex before it to p: not on the hull.
        if ((pool.v[q] - v0) * static_cast<double>(pool.t[p] - t0) <=
            (pool.v[p] - v0) * static_cast<double>(pool.t[q] - t0))
          hull.pop_back();
        else
          break;
      }
      hull.push_back(p);
    }
    for (std::size_t h = 0; h < hull.size(); ++h) {
      const std::int64_t t0 = h > 0 ? pool.t[hull[h - 1]] : 0;
      const double v0 = h > 0 ? pool.v[hull[h - 1]] : 0.0;
      seg_t.push_back(pool.t[hull[h]] - t0);
      seg_v.push_back(pool.v[hull[h]] - v0);
      seg_item.push_back(b - a == 1 ? hull[h] : m);
      seg_to.push_back(hull[h]);
      seg_from.push_back(h > 0 ? hull[h - 1] : m);
    }
    a = b;
  }
  std::vector<std::uint64_t> dkeys(seg_t.size());
  for (std::size_t s = 0; s < seg_t.size(); ++s) dkeys[s] = descending_key(seg_v[s] / static_cast<double>(seg_t[s]));
  const std::vector<std::size_t> order = stable_order_wide(dkeys);
  Segments out;
  const std::size_t s_count = order.size();
  out.pt.assign(s_count + 1, 0);
  out.pv.assign(s_count + 1, 0.0);
  out.dt.resize(s_count);
  out.dv.resize(s_count);
  out.at.assign(m, m);
  out.to.resize(s_count);
  out.from.resize(s_count);
  for (std::size_t k = 0; k < s_count; ++k) {
    const std::size_t s = order[k];
    out.to[k] = seg_to[s];
    out.from[k] = seg_from[s];
    out.dt[k] = seg_t[s];
    out.dv[k] = seg_v[s];
    out.pt[k + 1] = out.pt[k] + seg_t[s];
    out.pv[k + 1] = out.pv[k] + seg_v[s];
    if (seg_item[s] != m) out.at[seg_item[s]] = k;
  }
  return out;
}

// The multiple-choice greedy: the LP's packing without its fraction. Segments in density
// order, each that fits moving its group's choice one hull vertex on; a group whose next
// segment does not fit stays where it is. A segment is only taken from the vertex it
// starts at: on (nearly) collinear hulls rounding can order a group's segments out of
// hull order, and the group then stays where it is too.
std::vector<char> hull_greedy(const Pool& pool, const Segments& seg) {
  const std::size_t m = pool.size();
  std::vector<char> chosen(m, 0), blocked(pool.groups, 0);
  std::vector<std::size_t> at(pool.groups, m);  // each group's current vertex (m: none)
  std::int64_t room = pool.capacity;
  for (std::size_t k = 0; k < seg.dt.size(); ++k) {
    const std::uint32_t g = pool.group[seg.to[k]];
    if (blocked[g]) continue;
    if (seg.dt[k] > room || at[g] != seg.from[k]) {
      blocked[g] = 1;
      continue;
    }
    room -= seg.dt[k];
    if (seg.from[k] != m) chosen[seg.from[k]] = 0;
    chosen[seg.to[k]] = 1;
    at[g] = seg.to[k];
  }
  return chosen;
}

// Bound fixing on the multiple-choice LP: an item whose value plus the LP of the rest in
// the room it leaves cannot beat `lb` is fixed out (the LP over every group, its own
// included, bounds the other groups' best); a singleton whose LP without it cannot beat
// `lb` is fixed in. Members of larger groups are never fixed in here.
Fixing fix_by_bounds_grouped(const Pool& pool, const Segments& seg, double lb) {
  const std::size_t m = pool.size();
  const double scale = std::max(std::abs(lb), seg.lp(pool.capacity));
  const double tol = (1e-12 + 4e-16 * static_cast<double>(m)) * scale;
  Fixing fx;
  fx.state.assign(m, Fix::Free);
  fx.residual = pool.capacity;
  for (std::size_t p = 0; p < m; ++p) {
    const std::int64_t rest = pool.capacity - pool.t[p];
    const bool single = seg.at[p] != m;
    const double with = pool.v[p] + (single ? seg.lp_without(seg.at[p], rest) : seg.lp(rest));
    if (with < lb - tol) {
      fx.state[p] = Fix::Out;
    } else if (single && seg.lp_without(seg.at[p], pool.capacity) < lb - tol) {
      fx.state[p] = Fix::In;
      fx.residual -= pool.t[p];
    }
  }
  return fx;
}

// Steps 4-6 for a pool (rank order, groups set) in which some group still has two or
// more members after undominated_in_groups. The same plan as solve_reduced, group-aware:
// bound fixing on the multiple-choice LP against the best packing in hand (two fixed-in
// items of one group prove the packing in hand optimal; a fixed-in item's group is
// closed to the rest), then the DP over groups on exact token counts when its table is
// small (the optimum), else over buckets with repair and refill, swaps, and the bounded
// search. The path is the DP's when the free items' bucket table fits under the ceiling.
std::vector<char> solve_grouped(Pool red, const PackOptions& options, PackResult& res, double& pool_bound) {
  const std::size_t m = red.size();
  order_by_density(red);
  const std::int64_t width = to_buckets(red.capacity, options.bucket_tokens) + 1;
  bool dp_path = width <= options.cell_ceiling / static_cast<std::int64_t>(m);
  res.path = dp_path ? PackPath::Dp : PackPath::Greedy;
  // The bar: the better of the item-density packing and the multiple-choice greedy, each
  // refilled and improved by swaps (the core step's exact window does not apply: the
  // items before it, all fixed in, may share a group).
  order_by_tokens(red);
  const Segments seg = hull_segments(red);
  pool_bound = seg.lp(red.capacity);
  std::vector<char> best = grouped_greedy(red), hull = hull_greedy(red, seg);
  grouped_refill(red, best);
  grouped_refill(red, hull);
  if (chosen_value(red, hull) > chosen_value(red, best)) best.swap(hull);
  for (int s = 0; s < kMaxSwaps && grouped_swap(red, best); ++s) grouped_refill(red, best);
  double bar = chosen_value(red, best);
  bool bucket_dp_done = false, fine_dp_done = false;
  for (int round = 1;; ++round) {
    const Fixing fx = fix_by_bounds_grouped(red, seg, bar);
    if (fx.residual < 0) {
      res.proven_optimal = true;  // the items fixed in cannot all fit: nothing beats the bar
      return best;
    }
    std::vector<char> fixed(m, 0), free_mask(m, 0), closed(red.groups, 0);
    for (std::size_t p = 0; p < m; ++p) {
      if (fx.state[p] != Fix::In) continue;
      if (closed[red.group[p]]) {
        res.proven_optimal = true;  // a better packing would hold two items of one group
        return best;
      }
      closed[red.group[p]] = 1;
      fixed[p] = 1;
    }
    for (std::size_t p = 0; p < m; ++p)
      if (fx.state[p] == Fix::Free && red.t[p] <= fx.residual && !closed[red.group[p]]) free_mask[p] = 1;
    Pool sub = grouped_subset(red, free_mask, fx.residual);
    res.free_items = static_cast<std::int64_t>(sub.size());
    const double fixed_value = chosen_value(red, fixed);
    auto lift = [&](const std::vector<char>& sub_chosen) {
      std::vector<char> cand = fixed;
      for (std::size_t p = 0, q = 0; p < m; ++p)
        if (free_mask[p]) cand[p] = sub_chosen[q++];
      const double value = chosen_value(red, cand);
      if (!(value > bar)) return false;
      best.swap(cand);
      bar = value;
      return true;
    };
    if (sub.size() == 0) {
      lift({});
      res.proven_optimal = true;
      return best;
    }
    const auto ms = static_cast<std::int64_t>(sub.size());
    const std::int64_t room = sub.capacity;
    if (round == 1 && !dp_path) {
      // The path is decided on what the exact reductions leave, as without groups (where
      // dominance does the reducing): the DP when the free items' table fits.
      dp_path = to_buckets(room, options.bucket_tokens) + 1 <= options.cell_ceiling / ms;
      res.path = dp_path ? PackPath::Dp : PackPath::Greedy;
    }
    const std::int64_t exact_cells = std::max(options.core_cell_limit, dp_path ? options.cell_ceiling : 0);
    if (room + 1 <= exact_cells / ms) {
      // The DP over groups on exact token counts: the free items' optimum.
      if (dp_path) res.dp_cells += (room + 1) * ms;
      lift(grouped_dp_select(sub, 1, static_cast<std::size_t>(room + 1)));
      res.proven_optimal = true;
      return best;
    }
    order_by_density(sub);
    if (dp_path && !bucket_dp_done) {
      bucket_dp_done = true;
      const std::int64_t sub_width = to_buckets(room, options.bucket_tokens) + 1;
      res.dp_cells += sub_width * ms;
      std::vector<char> chosen = grouped_dp_select(sub, options.bucket_tokens, static_cast<std::size_t>(sub_width));
      repair(sub, chosen);  // drops items only: the groups stay single
      grouped_refill(sub, chosen);
      // And with weights rounded up (capacity down): what it picks fits, so nothing is
      // dropped by repair, which costs most where scores track tokens (collinear hulls).
      res.dp_cells += (room / options.bucket_tokens + 1) * ms;
      std::vector<char> up = grouped_dp_select(sub, options.bucket_tokens,
                                               static_cast<std::size_t>(room / options.bucket_tokens + 1), true);
      grouped_refill(sub, up);
      if (chosen_value(sub, up) > chosen_value(sub, chosen)) chosen.swap(up);
      if (lift(chosen)) continue;  // a higher bar fixes more: reduce again
    }
    order_by_tokens(sub);
    bool consistent = true;
    for (std::size_t p = 0; p < m && consistent; ++p) consistent = free_mask[p] || best[p] == fixed[p];
    std::vector<char> chosen;
    if (consistent) {
      for (std::size_t p = 0; p < m; ++p)
        if (free_mask[p]) chosen.push_back(best[p]);
    } else {
      chosen = grouped_greedy(sub);
      grouped_refill(sub, chosen);
    }
    const std::int64_t per_item = options.core_cell_limit / ms;
    if (!fine_dp_done && per_item >= 2) {
      fine_dp_done = true;
      const std::int64_t bucket = room / (per_item - 1) + 1;
      if (!dp_path || bucket < options.bucket_tokens) {
        std::vector<char> fine =
            grouped_dp_select(sub, bucket, static_cast<std::size_t>(room / bucket + 1), /*round_up=*/true);
        grouped_refill(sub, fine);
        if (chosen_value(sub, fine) > chosen_value(sub, chosen)) chosen.swap(fine);
      }
    }
    for (int s = 0; s < kMaxSwaps && grouped_swap(sub, chosen); ++s) grouped_refill(sub, chosen);
    if (lift(chosen) && round < kMaxFixRounds) continue;  // a higher bar: fix again
    const SearchOutcome outcome = search<true>(sub, chosen, options.search_node_limit, bar - fixed_value);
    res.search_nodes = outcome.nodes;
    res.proven_optimal = outcome.complete;
    repair(sub, chosen);  // a no-op by construction; the budget guarantee does not rest on it
    lift(chosen);
    return best;
  }
}

// Steps 2-6 with groups, on the candidates in rank order with `room` tokens: sets every
// reason, the path and the record, and returns the upper bound.
//
// Pinned members claim their group (a later pinned member of a claimed group is
// redundant). A group's first zero-token member by rank is its base: taken unless a member
// with tokens is chosen instead, so members with tokens enter the pool with their score
// less the base's, and those not above it stay out. What is left is one multiple-choice
// knapsack, solved by the ungrouped steps when no group keeps two members.
CTXCORE_COLD double pack_grouped(const PackInput& in, const std::vector<std::size_t>& order, std::int64_t room,
                                 bool any_pinned, const PackOptions& options, PackResult& res) {
  const std::size_t n = in.ids.size;
  const auto is_pinned = [&](std::size_t i) { return any_pinned && in.pinned[i] != 0; };
  // Compact group ids, numbered in rank order (the DP's rows and the hull's ties follow
  // them, so they must not depend on the input order): candidates in no group (-1) each
  // get one of their own.
  std::vector<std::uint32_t> gid(n);
  std::size_t groups = 0;
  {
    std::unordered_map<std::int64_t, std::uint32_t> ids;
    ids.reserve(n);
    for (std::size_t i : order) {
      if (in.groups[i] < 0) {
        gid[i] = static_cast<std::uint32_t>(groups++);
        continue;
      }
      const auto found = ids.emplace(in.groups[i], static_cast<std::uint32_t>(groups));
      if (found.second) ++groups;
      gid[i] = found.first->second;
    }
  }
  std::vector<char> taken(groups, 0);
  double fixed = 0.0;
  if (any_pinned) {
    for (std::size_t i : order) {
      if (!is_pinned(i)) continue;
      if (taken[gid[i]]) {
        res.reasons[i] = Reason::Redundant;
      } else if (in.tokens[i] <= room) {
        room -= in.tokens[i];
        res.reasons[i] = Reason::Pinned;
        taken[gid[i]] = 1;
        fixed += in.scores[i];
      } else {
        res.reasons[i] = Reason::PinnedOverBudget;
      }
    }
  }
  std::vector<double> base(groups, 0.0);
  std::vector<std::size_t> base_item(groups, n);
  for (std::size_t i : order) {
    if (is_pinned(i)) continue;
    if (!(in.scores[i] > 0.0))
      res.reasons[i] = Reason::NonPositiveScore;
    else if (in.tokens[i] == 0 && !taken[gid[i]] && base_item[gid[i]] == n) {
      base_item[gid[i]] = i;
      base[gid[i]] = in.scores[i];
      fixed += in.scores[i];
    }
  }
  Pool pool;
  pool.capacity = room;
  pool.groups = groups;
  bool rebased = false;
  for (std::size_t i : order) {
    const std::uint32_t g = gid[i];
    if (is_pinned(i) || taken[g] || !(in.scores[i] > base[g]) || in.tokens[i] == 0 || in.tokens[i] > room) continue;
    pool.input.push_back(i);
    pool.t.push_back(in.tokens[i]);
    pool.v.push_back(in.scores[i] - base[g]);
    pool.group.push_back(g);
    rebased = rebased || base[g] > 0.0;
  }
  if (rebased) {
    // The pool is in rank order, by descending value (the steps above rely on it, e.g.
    // dominance): values less a base are re-sorted, rank order among equal values.
    std::vector<std::uint64_t> keys(pool.size());
    for (std::size_t p = 0; p < pool.size(); ++p) keys[p] = descending_key(pool.v[p]);
    const std::vector<std::size_t> by_value = stable_order_wide(keys);
    Pool sorted;
    sorted.capacity = pool.capacity;
    sorted.groups = pool.groups;
    for (std::size_t p : by_value) {
      sorted.input.push_back(pool.input[p]);
      sorted.t.push_back(pool.t[p]);
      sorted.v.push_back(pool.v[p]);
      sorted.group.push_back(pool.group[p]);
    }
    pool = std::move(sorted);
  }
  const std::vector<char> kept = undominated_in_groups(pool);
  Pool red = grouped_subset(pool, kept, pool.capacity);
  res.dominated = static_cast<std::int64_t>(pool.size() - red.size());
  std::vector<std::uint32_t> members(groups, 0);
  bool several = false;
  for (std::uint32_t g : red.group) several = several || ++members[g] > 1;
  double pool_bound = 0.0;
  std::vector<char> best;
  if (several) {
    best = solve_grouped(red, options, res, pool_bound);
  } else {
    red.group.clear();
    red.groups = 0;
    best = solve_pool(red, options, res, pool_bound);
  }
  // The selection as candidates: the pool's choice, then each base whose group it left open.
  std::vector<char> selected(n, 0);
  std::vector<char> claimed(taken);
  for (std::size_t q = 0; q < red.size(); ++q) {
    if (!best[q]) continue;
    selected[red.input[q]] = 1;
    claimed[gid[red.input[q]]] = 1;
  }
  for (std::size_t g = 0; g < groups; ++g) {
    if (base_item[g] != n && !claimed[g]) {
      selected[base_item[g]] = 1;
      claimed[g] = 1;
    }
  }
  if (options.rank_tolerance > 0.0 && res.path != PackPath::Trivial) {
    // The rank-order packing: by rank, each candidate that still fits and whose group is open.
    std::vector<char> ranked(n, 0), open_taken(taken);
    std::int64_t room_left = room;
    double ranked_value = 0.0, chosen_total = 0.0;
    for (std::size_t i : order) {
      if (is_pinned(i) || !(in.scores[i] > 0.0)) continue;
      if (selected[i]) chosen_total += in.scores[i];
      if (!open_taken[gid[i]] && in.tokens[i] <= room_left) {
        ranked[i] = 1;
        open_taken[gid[i]] = 1;
        room_left -= in.tokens[i];
        ranked_value += in.scores[i];
      }
    }
    if (ranked != selected && ranked_value >= (1.0 - options.rank_tolerance) * chosen_total) {
      selected.swap(ranked);
      res.rank_order = true;
      res.proven_optimal = res.proven_optimal && ranked_value >= chosen_total;
      std::fill(claimed.begin(), claimed.end(), char{0});
      for (std::size_t i = 0; i < n; ++i)
        if (selected[i] || res.reasons[i] == Reason::Pinned) claimed[gid[i]] = 1;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (is_pinned(i) || res.reasons[i] == Reason::NonPositiveScore) continue;
    if (selected[i])
      res.reasons[i] = Reason::Selected;
    else
      res.reasons[i] = claimed[gid[i]] ? Reason::Redundant : Reason::BudgetExhausted;
  }
  return fixed + pool_bound;
}

}  // namespace

// ---- the pipeline -------------------------------------------------------------------
PackResult pack(const PackInput& in, std::int64_t budget, const PackOptions& options) {
  validate_options(options);
  validate_candidates(in);
  const std::size_t n = in.ids.size;
  const bool any_pinned =
      in.pinned.size != 0 && std::any_of(in.pinned.data, in.pinned.data + n, [](std::uint8_t f) { return f != 0; });
  const auto is_pinned = [&](std::size_t i) { return any_pinned && in.pinned[i] != 0; };

  PackResult res;
  res.evaluated = static_cast<std::int64_t>(n);
  res.reasons.assign(n, Reason::BudgetExhausted);
  // Rank order; with no budget nothing is selected and nothing needs ordering.
  const std::vector<std::size_t> order = budget > 0 ? rank_candidates(in) : std::vector<std::size_t>();

  if (budget <= 0) {
    // No decision to make: nothing fits. Candidates present make this a truncation.
    res.proven_optimal = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (is_pinned(i))
        res.reasons[i] = Reason::PinnedOverBudget;
      else if (!(in.scores[i] > 0.0))
        res.reasons[i] = Reason::NonPositiveScore;
    }
  } else if (in.groups.size != 0) {
    res.upper_bound = pack_grouped(in, order, std::min(budget, kBudgetClamp), any_pinned, options, res);
  } else {
    // Step 2: pinned first, in rank order, each while it fits.
    std::int64_t room = std::min(budget, kBudgetClamp);
    if (any_pinned) {
      for (std::size_t i : order) {
        if (!is_pinned(i)) continue;
        if (in.tokens[i] <= room) {
          room -= in.tokens[i];
          res.reasons[i] = Reason::Pinned;
        } else {
          res.reasons[i] = Reason::PinnedOverBudget;
        }
      }
    }
    Pool pool;
    pool.capacity = room;
    pool.input.reserve(n);
    pool.t.reserve(n);
    pool.v.reserve(n);
    // What is decided before optimizing (pinned and taken, free and positive), summed in
    // rank order for the upper bound.
    double fixed = 0.0;
    for (std::size_t i : order) {
      if (is_pinned(i)) {
        if (res.reasons[i] == Reason::Pinned) fixed += in.scores[i];
        continue;
      }
      if (!(in.scores[i] > 0.0)) {
        res.reasons[i] = Reason::NonPositiveScore;
      } else if (in.tokens[i] == 0) {
        res.reasons[i] = Reason::Selected;  // free and positive: always in
        fixed += in.scores[i];
      } else if (in.tokens[i] <= room) {
        pool.input.push_back(i);
        pool.t.push_back(in.tokens[i]);
        pool.v.push_back(in.scores[i]);
      }  // else: larger than all the room there is; stays BudgetExhausted
    }
    double pool_bound = 0.0;
    std::vector<char> chosen = solve_pool(pool, options, res, pool_bound);
    if (options.rank_tolerance > 0.0 && res.path != PackPath::Trivial) {
      // The rank-order packing: the pool is in rank order; each candidate that still fits.
      std::vector<char> ranked(pool.size(), 0);
      std::int64_t room_left = pool.capacity;
      double ranked_value = 0.0, chosen_total = 0.0;
      for (std::size_t p = 0; p < pool.size(); ++p) {
        if (chosen[p]) chosen_total += pool.v[p];
        if (pool.t[p] <= room_left) {
          ranked[p] = 1;
          room_left -= pool.t[p];
          ranked_value += pool.v[p];
        }
      }
      if (ranked != chosen && ranked_value >= (1.0 - options.rank_tolerance) * chosen_total) {
        chosen.swap(ranked);
        res.rank_order = true;
        res.proven_optimal = res.proven_optimal && ranked_value >= chosen_total;
      }
    }
    for (std::size_t p = 0; p < pool.size(); ++p)
      res.reasons[pool.input[p]] = chosen[p] ? Reason::Selected : Reason::BudgetExhausted;

    // Upper bound: what is already fixed plus the LP relaxation of the pool that dominance
    // leaves (whose optimum is the pool's).
    res.upper_bound = fixed + pool_bound;
  }

  // Step 7: emit pinned first, then the rest, each in rank order.
  if (any_pinned)
    for (std::size_t i : order)
      if (res.reasons[i] == Reason::Pinned) res.indices.push_back(static_cast<std::int64_t>(i));
  for (std::size_t i : order)
    if (res.reasons[i] == Reason::Selected) res.indices.push_back(static_cast<std::int64_t>(i));
  for (std::int64_t i : res.indices) {
    res.tokens_used += in.tokens[static_cast<std::size_t>(i)];
    res.total_score += in.scores[static_cast<std::size_t>(i)];
  }
  for (Reason r : res.reasons) {
    if (r == Reason::BudgetExhausted || r == Reason::PinnedOverBudget)
      ++res.excluded_for_budget;
    else if (r == Reason::Redundant)
      ++res.redundant;
  }
  res.truncated = n > 0 && (budget <= 0 || res.excluded_for_budget > 0);
  // The bound and the total are summed in different orders; where the packing is exactly
  // the LP optimum the two can differ in the last bit. Keep the documented invariant.
  if (res.upper_bound < res.total_score) res.upper_bound = res.total_score;
  return res;
}

}  // namespace ctxcore

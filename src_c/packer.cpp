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
#include <numeric>

namespace ctxcore {
namespace {

// Budgets above every possible token sum (see kMaxTokens) are clamped to this.
constexpr std::int64_t kBudgetClamp = std::int64_t{1} << 62;
// Bound on applied 1-for-1 swaps per call: each costs O(m log m), and after the core step
// there are rarely more than a few left to find.
constexpr int kMaxSwaps = 16;

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
    throw std::invalid_argument("search_node_limit must be >= 0, got " +
                                std::to_string(opt.search_node_limit));
}

void validate_candidates(const PackInput& in) {
  const std::size_t n = in.ids.size;
  if (in.tokens.size != n || in.scores.size != n || (in.pinned.size != 0 && in.pinned.size != n)) {
    throw InvalidCandidate("mismatched lengths: " + std::to_string(n) + " ids, " +
                               std::to_string(in.tokens.size) + " tokens, " +
                               std::to_string(in.scores.size) + " scores, " +
                               std::to_string(in.pinned.size) + " pinned flags",
                           -1, "");
  }
  if (n > kMaxCandidates) {
    throw InvalidCandidate("too many candidates: " + std::to_string(n) + " > " +
                               std::to_string(kMaxCandidates),
                           -1, "");
  }
  double positive_sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (in.ids[i].empty()) fail(in, i, "id must be a non-empty string");
    if (in.tokens[i] < 0) fail(in, i, "tokens must be >= 0, got " + std::to_string(in.tokens[i]));
    if (in.tokens[i] > kMaxTokens)
      fail(in, i, "tokens must be <= 2**40, got " + std::to_string(in.tokens[i]));
    if (!std::isfinite(in.scores[i])) fail(in, i, "score must be finite");
    if (in.scores[i] > 0.0) {
      positive_sum += in.scores[i];
      if (!std::isfinite(positive_sum)) fail(in, i, "scores are so large that their sum overflows");
    }
  }
  // Duplicate ids: an open-addressing table of input positions, O(n) expected.
  std::size_t slots = 16;
  while (slots < 2 * n) slots <<= 1;
  std::vector<std::size_t> table(slots, n);  // n marks an empty slot
  const std::hash<std::string_view> hasher;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t h = hasher(in.ids[i]) & (slots - 1);
    while (table[h] != n) {
      if (in.ids[table[h]] == in.ids[i])
        fail(in, i, "duplicate id (first seen at index " + std::to_string(table[h]) + ")");
      h = (h + 1) & (slots - 1);
    }
    table[h] = i;
  }
}

// Descending score, then ascending id (UTF-8 byte order, which is code point order).
// Ids are unique, so this is a total order and the ranking is independent of input order.
std::vector<std::size_t> rank_candidates(const PackInput& in) {
  // Sort (score, position) pairs in place rather than positions through an indirection:
  // contiguous keys, and the id is only looked at on an exact score tie.
  struct Key {
    double score;
    std::size_t index;
  };
  std::vector<Key> keys(in.ids.size);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = {in.scores[i], i};
  std::sort(keys.begin(), keys.end(), [&](const Key& a, const Key& b) {
    if (a.score != b.score) return a.score > b.score;
    return in.ids[a.index] < in.ids[b.index];
  });
  std::vector<std::size_t> order(keys.size());
  for (std::size_t k = 0; k < keys.size(); ++k) order[k] = keys[k].index;
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
  std::int64_t capacity = 0;

  std::size_t size() const { return t.size(); }
};

void order_pool(Pool& pool) {
  struct Key {
    double density;
    std::size_t pos;  // pool position = rank order, the tie-break
  };
  std::vector<Key> keys(pool.size());
  for (std::size_t p = 0; p < keys.size(); ++p) keys[p] = {pool.v[p] / static_cast<double>(pool.t[p]), p};
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    return a.density != b.density ? a.density > b.density : a.pos < b.pos;
  });
  pool.by_density.resize(keys.size());
  for (std::size_t k = 0; k < keys.size(); ++k) pool.by_density[k] = keys[k].pos;
  pool.by_tokens.resize(pool.size());
  std::iota(pool.by_tokens.begin(), pool.by_tokens.end(), std::size_t{0});
  std::stable_sort(pool.by_tokens.begin(), pool.by_tokens.end(),
                   [&](std::size_t a, std::size_t b) { return pool.t[a] < pool.t[b]; });
}

std::int64_t chosen_tokens(const Pool& pool, const std::vector<char>& chosen) {
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < pool.size(); ++i)
    if (chosen[i]) sum += pool.t[i];
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

// ---- step 3a: DP over token buckets -------------------------------------------------
// Weights and capacity are rounded to the nearest bucket (at least one bucket per item):
// the DP then sees the problem with unbiased error, and step 4 repairs the exact sum.
std::int64_t to_buckets(std::int64_t tokens, std::int64_t bucket) {
  const std::int64_t q = tokens / bucket;
  const std::int64_t r = tokens % bucket;
  return q + (r >= bucket - r ? 1 : 0);
}

std::vector<char> dp_select(const std::vector<std::int64_t>& tokens, const std::vector<double>& values,
                            std::int64_t bucket, std::size_t width) {
  const std::size_t m = tokens.size();
  const std::size_t row_bytes = (width + 7) / 8;
  std::vector<std::uint8_t> choice(m * row_bytes, 0);  // bit-packed: item i took bucket w
  std::vector<double> prev(width, 0.0), cur(width, 0.0);
  std::vector<std::uint8_t> took(row_bytes * 8, 0);
  std::vector<std::size_t> weight(m);

  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t wi = static_cast<std::size_t>(std::max<std::int64_t>(1, to_buckets(tokens[i], bucket)));
    weight[i] = wi;
    const double vi = values[i];
    if (wi < width) {
      std::copy(prev.begin(), prev.begin() + static_cast<std::ptrdiff_t>(wi), cur.begin());
      std::fill(took.begin(), took.begin() + static_cast<std::ptrdiff_t>(wi), std::uint8_t{0});
      // Separate input and output rows keep both loops free of carried dependencies, so
      // the compiler vectorizes them (a max, then a compare narrowed to bytes).
      const double* __restrict p = prev.data();
      double* __restrict c = cur.data();
      std::uint8_t* __restrict k = took.data();
      for (std::size_t w = wi; w < width; ++w) c[w] = std::max(p[w], p[w - wi] + vi);
      for (std::size_t w = wi; w < width; ++w) k[w] = static_cast<std::uint8_t>(c[w] > p[w]);
    } else {
      std::copy(prev.begin(), prev.end(), cur.begin());
      std::fill(took.begin(), took.end(), std::uint8_t{0});
    }
    // Pack eight 0/1 bytes into one bit-row byte: the multiply gathers byte j's low bit
    // into bit 56 + j, with no carries between the eight products.
    std::uint8_t* row = choice.data() + i * row_bytes;
    for (std::size_t byte = 0; byte < row_bytes; ++byte) {
      std::uint64_t eight;
      std::memcpy(&eight, took.data() + byte * 8, 8);
      row[byte] = static_cast<std::uint8_t>((eight * 0x0102040810204080ULL) >> 56);
    }
    std::swap(prev, cur);
  }

  std::vector<char> chosen(m, 0);
  std::size_t w = width - 1;
  for (std::size_t i = m; i-- > 0;) {
    const std::uint8_t* row = choice.data() + i * row_bytes;
    if ((static_cast<unsigned>(row[w / 8]) >> (w % 8)) & 1U) {
      chosen[i] = 1;
      w -= weight[i];
    }
  }
  return chosen;
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
    if (chosen[p] && pool.t[p] >= excess && (single == pool.size() || pool.v[p] < pool.v[single]))
      single = p;
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
  double sum = 0.0;
  for (std::size_t p = 0; p < pool.size(); ++p)
    if (chosen[p]) sum += pool.v[p];
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

// Depth-first branch-and-bound over items in density order with the LP bound (Horowitz
// and Sahni), seeded with the current selection as the incumbent and stopped after
// `limit` nodes. It only ever replaces the incumbent with a strictly better feasible set;
// when it finishes inside the limit the result is a proven optimum.
struct SearchOutcome {
  bool complete = false;
  std::int64_t nodes = 0;
};

SearchOutcome branch_and_bound(const Pool& pool, std::vector<char>& chosen, std::int64_t limit) {
  SearchOutcome out;
  const std::size_t m = pool.size();
  if (limit <= 0 || m == 0) {
    out.complete = (m == 0);
    return out;
  }
  std::vector<std::int64_t> dt(m), pt(m + 1, 0);
  std::vector<double> dv(m), pv(m + 1, 0.0);
  for (std::size_t k = 0; k < m; ++k) {
    const std::size_t p = pool.by_density[k];
    dt[k] = pool.t[p];
    dv[k] = pool.v[p];
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
  const double tol = 1e-12 * pv[m];

  auto lp = [&](std::size_t k, std::int64_t cap) {
    // Largest j with pt[j] - pt[k] <= cap: items k..j-1 fit whole, j is the break item.
    const auto it = std::upper_bound(pt.begin() + static_cast<std::ptrdiff_t>(k), pt.end(), pt[k] + cap);
    const std::size_t j = static_cast<std::size_t>(it - pt.begin()) - 1;
    double bound = pv[j] - pv[k];
    if (j < m) bound += dv[j] * (static_cast<double>(cap - (pt[j] - pt[k])) / static_cast<double>(dt[j]));
    return bound;
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
      if (pt[m] - pt[f.k] <= f.cap) {  // everything left fits: this subtree's best leaf
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
      if (dt[f.k] <= f.cap) {
        x[f.k] = 1;
        stack.push_back({f.k + 1, f.cap - dt[f.k], f.val + dv[f.k], 0});
        continue;
      }
    }
    Frame& g = stack.back();
    if (g.stage == 1) {
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

}  // namespace

// ---- the pipeline -------------------------------------------------------------------
PackResult pack(const PackInput& in, std::int64_t budget, const PackOptions& options) {
  validate_options(options);
  validate_candidates(in);
  const std::size_t n = in.ids.size;
  const auto is_pinned = [&](std::size_t i) { return in.pinned.size != 0 && in.pinned[i] != 0; };

  PackResult res;
  res.evaluated = static_cast<std::int64_t>(n);
  res.reasons.assign(n, Reason::BudgetExhausted);
  const std::vector<std::size_t> order = rank_candidates(in);

  if (budget <= 0) {
    // No decision to make: nothing fits. Candidates present make this a truncation.
    res.proven_optimal = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (is_pinned(i)) res.reasons[i] = Reason::PinnedOverBudget;
      else if (!(in.scores[i] > 0.0)) res.reasons[i] = Reason::NonPositiveScore;
    }
  } else {
    // Step 2: pinned first, in rank order, each while it fits.
    std::int64_t room = std::min(budget, kBudgetClamp);
    for (std::size_t i : order) {
      if (!is_pinned(i)) continue;
      if (in.tokens[i] <= room) {
        room -= in.tokens[i];
        res.reasons[i] = Reason::Pinned;
      } else {
        res.reasons[i] = Reason::PinnedOverBudget;
      }
    }
    Pool pool;
    pool.capacity = room;
    std::int64_t pool_tokens = 0;
    for (std::size_t i : order) {
      if (is_pinned(i)) continue;
      if (!(in.scores[i] > 0.0)) {
        res.reasons[i] = Reason::NonPositiveScore;
      } else if (in.tokens[i] == 0) {
        res.reasons[i] = Reason::Selected;  // free and positive: always in
      } else if (in.tokens[i] <= room) {
        pool.input.push_back(i);
        pool.t.push_back(in.tokens[i]);
        pool.v.push_back(in.scores[i]);
        pool_tokens += in.tokens[i];
      }  // else: larger than all the room there is; stays BudgetExhausted
    }
    std::vector<char> chosen(pool.size(), 1);
    if (pool_tokens <= pool.capacity) {
      res.path = PackPath::Trivial;
      res.proven_optimal = true;
    } else {
      order_pool(pool);
      // Step 3: DP while the table stays under the ceiling, else the fallback.
      const std::int64_t bucket = options.bucket_tokens;
      const std::int64_t width = to_buckets(pool.capacity, bucket) + 1;
      const std::int64_t per_item = options.cell_ceiling / static_cast<std::int64_t>(pool.size());
      if (width <= per_item) {
        res.path = PackPath::Dp;
        res.dp_cells = width * static_cast<std::int64_t>(pool.size());
        chosen = dp_select(pool.t, pool.v, bucket, static_cast<std::size_t>(width));
        repair(pool, chosen);
        refill(pool, chosen);
        // The density start costs O(m) more; on sets of items smaller than a bucket it is
        // often the better of the two, since each such item costs the DP a whole bucket.
        std::vector<char> density = greedy_select(pool);
        refill(pool, density);
        if (chosen_value(pool, density) > chosen_value(pool, chosen)) chosen.swap(density);
      } else {
        res.path = PackPath::Greedy;
        chosen = greedy_select(pool);
        refill(pool, chosen);
      }
      // Steps 4-5: exact core, swaps, bounded search; repair is exact at every step.
      if (core_improve(pool, chosen, options.core_cell_limit)) refill(pool, chosen);
      for (int s = 0; s < kMaxSwaps && best_swap(pool, chosen); ++s) refill(pool, chosen);
      const SearchOutcome search = branch_and_bound(pool, chosen, options.search_node_limit);
      res.search_nodes = search.nodes;
      res.proven_optimal = search.complete;
      repair(pool, chosen);  // a no-op by construction; the budget guarantee does not rest on it
    }
    for (std::size_t p = 0; p < pool.size(); ++p)
      res.reasons[pool.input[p]] = chosen[p] ? Reason::Selected : Reason::BudgetExhausted;

    // Upper bound: what is already fixed plus the LP relaxation of the pool.
    double fixed = 0.0;
    for (std::size_t i : order)
      if (res.reasons[i] == Reason::Pinned || (res.reasons[i] == Reason::Selected && in.tokens[i] == 0))
        fixed += in.scores[i];
    // When everything fits, the LP optimum is the whole pool.
    res.upper_bound = fixed + (res.path == PackPath::Trivial ? std::accumulate(pool.v.begin(), pool.v.end(), 0.0)
                                                              : lp_bound(pool));
  }

  // Step 6: emit pinned first, then the rest, each in rank order.
  for (std::size_t i : order)
    if (res.reasons[i] == Reason::Pinned) res.indices.push_back(static_cast<std::int64_t>(i));
  for (std::size_t i : order)
    if (res.reasons[i] == Reason::Selected) res.indices.push_back(static_cast<std::int64_t>(i));
  for (std::int64_t i : res.indices) {
    res.tokens_used += in.tokens[static_cast<std::size_t>(i)];
    res.total_score += in.scores[static_cast<std::size_t>(i)];
  }
  for (Reason r : res.reasons)
    if (r == Reason::BudgetExhausted || r == Reason::PinnedOverBudget) ++res.excluded_for_budget;
  res.truncated = n > 0 && (budget <= 0 || res.excluded_for_budget > 0);
  // The bound and the total are summed in different orders; where the packing is exactly
  // the LP optimum the two can differ in the last bit. Keep the documented invariant.
  if (res.upper_bound < res.total_score) res.upper_bound = res.total_score;
  return res;
}

}  // namespace ctxcore

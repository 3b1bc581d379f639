// Unit tests of the C++ packer, run through ctest (also under ASan + UBSan in CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ctxcore/packer.hpp"

namespace {

using ctxcore::PackOptions;
using ctxcore::PackPath;
using ctxcore::Reason;

struct Items {
  std::vector<std::string> names;
  std::vector<std::string_view> ids;
  std::vector<std::int64_t> tokens;
  std::vector<double> scores;
  std::vector<std::uint8_t> pinned;

  void add(std::string id, std::int64_t t, double s, bool pin = false) {
    names.push_back(std::move(id));
    tokens.push_back(t);
    scores.push_back(s);
    pinned.push_back(pin ? 1 : 0);
  }
  ctxcore::PackInput input() {
    ids.assign(names.begin(), names.end());
    ctxcore::PackInput in;
    in.ids = {ids.data(), ids.size()};
    in.tokens = {tokens.data(), tokens.size()};
    in.scores = {scores.data(), scores.size()};
    in.pinned = {pinned.data(), pinned.size()};
    return in;
  }
};

PackOptions opts(std::int64_t bucket = 16, std::int64_t ceiling = 1 << 22, std::int64_t nodes = 20000,
                 std::int64_t core = 1 << 17) {
  return PackOptions{bucket, ceiling, nodes, core};
}

double brute_force(const Items& it, std::int64_t budget) {
  const std::size_t n = it.tokens.size();
  double best = 0.0;
  for (std::uint32_t mask = 0; mask < (1U << n); ++mask) {
    std::int64_t t = 0;
    double v = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      if (mask & (1U << i)) {
        t += it.tokens[i];
        v += it.scores[i];
      }
    }
    if (t <= budget) best = std::max(best, v);
  }
  return best;
}

void expect_consistent(const Items& it, std::int64_t budget, const ctxcore::PackResult& r) {
  std::int64_t used = 0;
  double total = 0.0;
  for (std::int64_t i : r.indices) {
    used += it.tokens[static_cast<std::size_t>(i)];
    total += it.scores[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(used, r.tokens_used);
  EXPECT_NEAR(total, r.total_score, 1e-9);
  if (budget >= 0) {
    EXPECT_LE(r.tokens_used, budget);
  }
  EXPECT_LE(r.total_score, r.upper_bound);
  EXPECT_EQ(r.reasons.size(), it.tokens.size());
}

TEST(Packer, EmptyInputIsTrivialAndNotTruncated) {
  Items it;
  const auto r = ctxcore::pack(it.input(), 100, opts());
  EXPECT_EQ(r.path, PackPath::Trivial);
  EXPECT_FALSE(r.truncated);
  EXPECT_TRUE(r.indices.empty());
}

TEST(Packer, NonPositiveBudgetWithCandidatesIsTruncation) {
  for (std::int64_t budget : {std::int64_t{0}, std::int64_t{-5}, std::numeric_limits<std::int64_t>::min()}) {
    Items it;
    it.add("a", 0, 1.0);
    it.add("b", 10, 2.0);
    const auto r = ctxcore::pack(it.input(), budget, opts());
    EXPECT_EQ(r.path, PackPath::Trivial);
    EXPECT_TRUE(r.truncated);
    EXPECT_TRUE(r.indices.empty());
    EXPECT_EQ(r.excluded_for_budget, 2);
  }
}

TEST(Packer, EverythingFitsIsTrivial) {
  Items it;
  it.add("a", 10, 1.0);
  it.add("b", 20, 3.0);
  it.add("c", 0, 0.5);
  const auto r = ctxcore::pack(it.input(), std::numeric_limits<std::int64_t>::max(), opts());
  EXPECT_EQ(r.path, PackPath::Trivial);
  EXPECT_FALSE(r.truncated);
  ASSERT_EQ(r.indices.size(), 3U);
  EXPECT_EQ(r.indices[0], 1);  // score descending
  EXPECT_EQ(r.indices[1], 0);
  EXPECT_EQ(r.indices[2], 2);
}

TEST(Packer, NonPositiveScoresAreNeverChosenUnlessPinned) {
  Items it;
  it.add("neg", 1, -1.0);
  it.add("zero", 1, 0.0);
  it.add("pin", 1, -2.0, true);
  it.add("pos", 1, 1.0);
  const auto r = ctxcore::pack(it.input(), 100, opts());
  EXPECT_EQ(r.reasons[0], Reason::NonPositiveScore);
  EXPECT_EQ(r.reasons[1], Reason::NonPositiveScore);
  EXPECT_EQ(r.reasons[2], Reason::Pinned);
  EXPECT_EQ(r.reasons[3], Reason::Selected);
  EXPECT_FALSE(r.truncated);
  ASSERT_EQ(r.indices.size(), 2U);
  EXPECT_EQ(r.indices[0], 2);  // pinned first
}

TEST(Packer, PinnedTakenFirstAndOverflowingPinIsExcluded) {
  Items it;
  it.add("p1", 60, 0.1, true);
  it.add("p2", 50, 0.2, true);  // ranks first (higher score), so p1 no longer fits
  it.add("x", 40, 5.0);
  const auto r = ctxcore::pack(it.input(), 100, opts());
  EXPECT_EQ(r.reasons[1], Reason::Pinned);
  EXPECT_EQ(r.reasons[0], Reason::PinnedOverBudget);
  EXPECT_EQ(r.reasons[2], Reason::Selected);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.indices.front(), 1);
}

TEST(Packer, ValidationNamesTheCandidate) {
  struct Case {
    std::string id;
    std::int64_t tokens;
    double score;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {"", 1, 1.0, "non-empty"},
      {"neg", -1, 1.0, ">= 0"},
      {"big", ctxcore::kMaxTokens + 1, 1.0, "<= 2**40"},
      {"nan", 1, std::nan(""), "finite"},
      {"inf", 1, std::numeric_limits<double>::infinity(), "finite"},
  };
  for (const auto& c : cases) {
    Items it;
    it.add("ok", 1, 1.0);
    it.add(c.id, c.tokens, c.score);
    try {
      ctxcore::pack(it.input(), 10, opts());
      ADD_FAILURE() << "no error for " << c.fragment;
    } catch (const ctxcore::InvalidCandidate& e) {
      EXPECT_EQ(e.index(), 1);
      EXPECT_NE(std::string(e.what()).find(c.fragment), std::string::npos) << e.what();
    }
  }
}

TEST(Packer, DuplicateIdsAndMismatchedLengthsAreRejected) {
  Items it;
  it.add("a", 1, 1.0);
  it.add("b", 1, 1.0);
  it.add("a", 2, 3.0);
  try {
    ctxcore::pack(it.input(), 10, opts());
    ADD_FAILURE() << "duplicate accepted";
  } catch (const ctxcore::InvalidCandidate& e) {
    EXPECT_EQ(e.index(), 2);
    EXPECT_NE(std::string(e.what()).find("first seen at index 0"), std::string::npos);
  }
  auto in = it.input();
  in.scores.size = 2;
  EXPECT_THROW(ctxcore::pack(in, 10, opts()), ctxcore::InvalidCandidate);
}

TEST(Packer, OverflowingScoreSumIsRejected) {
  Items it;
  it.add("a", 1, 1.7e308);
  it.add("b", 1, 1.7e308);
  EXPECT_THROW(ctxcore::pack(it.input(), 10, opts()), ctxcore::InvalidCandidate);
}

TEST(Packer, BadOptionsAreRejected) {
  Items it;
  it.add("a", 1, 1.0);
  EXPECT_THROW(ctxcore::pack(it.input(), 10, opts(0)), std::invalid_argument);
  EXPECT_THROW(ctxcore::pack(it.input(), 10, opts(16, 0)), std::invalid_argument);
  EXPECT_THROW(ctxcore::pack(it.input(), 10, opts(16, 10, -1)), std::invalid_argument);
}

TEST(Packer, HugeTokensAndBudgetsStayExact) {
  Items it;
  for (int i = 0; i < 8; ++i) it.add("m" + std::to_string(i), ctxcore::kMaxTokens - i, 1.0 + i);
  for (std::int64_t budget : {ctxcore::kMaxTokens * 3, std::numeric_limits<std::int64_t>::max()}) {
    for (std::int64_t bucket : {std::int64_t{1}, std::int64_t{16}, std::numeric_limits<std::int64_t>::max()}) {
      const auto r = ctxcore::pack(it.input(), budget, opts(bucket, 1 << 20));
      expect_consistent(it, budget, r);
    }
  }
}

// Random instances: both paths (DP, and the fallback forced by a tiny ceiling), with and
// without the search, against brute force. With the search, small sets are solved exactly;
// without it, every result must still be feasible, consistent and bounded.
TEST(Packer, RandomSmallInstancesAgainstBruteForce) {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 3000; ++round) {
    Items it;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      it.add("c" + std::to_string(i), static_cast<std::int64_t>(rng() % 200),
             static_cast<double>(rng() % 1000) / 100.0 - (rng() % 10 == 0 ? 5.0 : 0.0));
    }
    const std::int64_t budget = static_cast<std::int64_t>(rng() % 800);
    const double opt = brute_force(it, budget);
    for (std::int64_t ceiling : {std::int64_t{1} << 22, std::int64_t{1}}) {
      for (std::int64_t nodes : {std::int64_t{0}, std::int64_t{20000}}) {
        const auto r = ctxcore::pack(it.input(), budget, opts(16, ceiling, nodes));
        expect_consistent(it, budget, r);
        EXPECT_LE(r.total_score, opt + 1e-9);
        EXPECT_GE(r.upper_bound, opt - 1e-9);
        if (nodes > 0) {
          EXPECT_TRUE(r.proven_optimal);
          EXPECT_NEAR(r.total_score, opt, 1e-9) << "round " << round;
        }
      }
    }
  }
}

TEST(Packer, DpWithoutSearchIsNearOptimalOnRealisticSets) {
  // Memory-sized items (30..600 tokens), a budget for ~40 of them; no branch-and-bound,
  // so this measures DP + repair + refill + swaps alone against the LP bound.
  std::mt19937_64 rng(7);
  double worst = 1.0;
  for (int round = 0; round < 50; ++round) {
    Items it;
    for (int i = 0; i < 400; ++i) {
      const auto t = static_cast<std::int64_t>(30 + rng() % 570);
      it.add("m" + std::to_string(i), t, static_cast<double>(rng() % 10000) / 10000.0);
    }
    const auto r = ctxcore::pack(it.input(), 12000, opts(16, 1 << 22, 0));
    ASSERT_EQ(r.path, PackPath::Dp);
    expect_consistent(it, 12000, r);
    worst = std::min(worst, r.total_score / r.upper_bound);
  }
  EXPECT_GE(worst, 0.995);
}

TEST(Packer, ResultDoesNotDependOnInputOrder) {
  std::mt19937_64 rng(99);
  Items it;
  for (int i = 0; i < 300; ++i) {
    it.add("k" + std::to_string(i), static_cast<std::int64_t>(1 + rng() % 300),
           static_cast<double>(rng() % 50));  // many ties
  }
  const auto a = ctxcore::pack(it.input(), 5000, opts());
  std::vector<std::size_t> perm(it.names.size());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  Items shuffled;
  for (std::size_t p : perm) shuffled.add(it.names[p], it.tokens[p], it.scores[p]);
  const auto b = ctxcore::pack(shuffled.input(), 5000, opts());
  ASSERT_EQ(a.indices.size(), b.indices.size());
  for (std::size_t k = 0; k < a.indices.size(); ++k) {
    EXPECT_EQ(it.names[static_cast<std::size_t>(a.indices[k])], shuffled.names[static_cast<std::size_t>(b.indices[k])]);
  }
}

// ---- exact reductions and the banded DP ------------------------------------------------

// Counting dominators is not enough: two lighter, better items fit beside the heavier one
// here, and the optimum takes all three.
TEST(Packer, DominanceNeedsTheDominatorsTokensToOverflow) {
  Items it;
  it.add("heavy", 5, 1.0);
  it.add("light-a", 1, 2.0);
  it.add("light-b", 1, 2.0);
  it.add("filler", 8, 0.5);
  const auto r = ctxcore::pack(it.input(), 10, opts(1, 1 << 22, 0, 0));
  expect_consistent(it, 10, r);
  EXPECT_NEAR(r.total_score, 5.0, 1e-12);
  EXPECT_EQ(r.reasons[0], Reason::Selected);
  EXPECT_EQ(r.dominated, 1);  // the filler: the three better items cannot all fit beside it
  EXPECT_EQ(r.reasons[3], Reason::BudgetExhausted);
}

// Equal items: room for 16 of 20; the 4 left out by dominance are the last in rank order
// (score, then id), and each keeps its own decision.
TEST(Packer, DominanceTiesGoToTheEarlierRankedItem) {
  Items it;
  for (int i = 19; i >= 0; --i) it.add("m" + std::to_string(100 + i), 1000, 1.0);
  for (std::int64_t ceiling : {std::int64_t{1} << 22, std::int64_t{1}}) {
    const auto r = ctxcore::pack(it.input(), 16000, opts(16, ceiling));
    expect_consistent(it, 16000, r);
    EXPECT_EQ(r.dominated, 4);
    EXPECT_TRUE(r.proven_optimal);
    EXPECT_EQ(r.excluded_for_budget, 4);
    for (std::size_t k = 0; k < it.names.size(); ++k) {
      const bool first_sixteen = it.names[k] < "m116";
      EXPECT_EQ(r.reasons[k], first_sixteen ? Reason::Selected : Reason::BudgetExhausted) << it.names[k];
    }
  }
}

// Instances built to be mostly dominated (few distinct sizes and scores, many ties): every
// option set against brute force; a proven optimum must be the optimum.
TEST(Packer, ReductionsAgainstBruteForce) {
  std::mt19937_64 rng(2024);
  int dominated_seen = 0, fixed_seen = 0;
  for (int round = 0; round < 2500; ++round) {
    Items it;
    const int n = 2 + static_cast<int>(rng() % 13);
    for (int i = 0; i < n; ++i) {
      it.add("d" + std::to_string(rng() % 1000) + "-" + std::to_string(i),
             static_cast<std::int64_t>(1 + (rng() % 5) * (1 + rng() % 40)), static_cast<double>(1 + rng() % 6) / 4.0,
             rng() % 16 == 0);
    }
    const std::int64_t budget = static_cast<std::int64_t>(rng() % 300);
    // Pinned items are taken first by rule; the optimum is over the rest, in the room left.
    Items rest;
    std::int64_t room = budget;
    std::vector<std::size_t> pinned_rank;
    for (std::size_t i = 0; i < it.names.size(); ++i) {
      if (it.pinned[i])
        pinned_rank.push_back(i);
      else if (it.scores[i] > 0)
        rest.add(it.names[i], it.tokens[i], it.scores[i]);
    }
    std::sort(pinned_rank.begin(), pinned_rank.end(), [&](std::size_t a, std::size_t b) {
      return it.scores[a] != it.scores[b] ? it.scores[a] > it.scores[b] : it.names[a] < it.names[b];
    });
    double pinned_value = 0.0;
    for (std::size_t i : pinned_rank) {
      if (budget > 0 && it.tokens[i] <= room) {
        room -= it.tokens[i];
        pinned_value += it.scores[i];
      }
    }
    const double opt = budget > 0 ? pinned_value + brute_force(rest, room) : 0.0;
    for (const PackOptions& o : {opts(16, 1 << 22, 20000), opts(16, 1, 20000), opts(1, 1 << 22, 0, 0),
                                 opts(7, 1 << 22, 0, 1 << 17), opts(16, 1, 0, 0)}) {
      const auto r = ctxcore::pack(it.input(), budget, o);
      expect_consistent(it, budget, r);
      EXPECT_LE(r.total_score, opt + 1e-9);
      EXPECT_GE(r.upper_bound, opt - 1e-9);
      if (r.proven_optimal) {
        EXPECT_NEAR(r.total_score, opt, 1e-9) << "round " << round;
      }
      if (o.search_node_limit > 0) {
        EXPECT_TRUE(r.proven_optimal) << "round " << round;
      }
      // With 1-token buckets and no improvement steps, the DP alone must be exact.
      if (o.bucket_tokens == 1 && r.path == PackPath::Dp) {
        EXPECT_NEAR(r.total_score, opt, 1e-9) << "round " << round;
      }
      dominated_seen += r.dominated > 0;
      fixed_seen += r.path != PackPath::Trivial && r.free_items < static_cast<std::int64_t>(rest.names.size());
      for (std::size_t i = 0; i < it.names.size(); ++i) {
        if (!it.pinned[i] && it.scores[i] > 0 &&
            std::find(r.indices.begin(), r.indices.end(), static_cast<std::int64_t>(i)) == r.indices.end()) {
          EXPECT_EQ(r.reasons[i], Reason::BudgetExhausted);
        }
      }
    }
  }
  EXPECT_GT(dominated_seen, 500);
  EXPECT_GT(fixed_seen, 500);
}

// The banded DP on its own (1-token buckets, no core step, no search) against an exact DP on
// sets too large for brute force, with items of very different sizes so that the reachable
// band grows and shrinks across rows.
double exact_dp(const Items& it, std::int64_t budget) {
  std::vector<double> dp(static_cast<std::size_t>(budget) + 1, 0.0);
  for (std::size_t i = 0; i < it.tokens.size(); ++i) {
    const auto t = static_cast<std::size_t>(it.tokens[i]);
    if (it.scores[i] <= 0 || t == 0 || t >= dp.size()) continue;  // (these tests have no 0-token items)
    for (std::size_t w = dp.size() - 1; w >= t; --w) dp[w] = std::max(dp[w], dp[w - t] + it.scores[i]);
  }
  return dp.back();
}

TEST(Packer, BandedDpIsExactWithOneTokenBuckets) {
  std::mt19937_64 rng(77);
  for (int round = 0; round < 60; ++round) {
    Items it;
    const int n = 20 + static_cast<int>(rng() % 120);
    for (int i = 0; i < n; ++i) {
      const bool big = rng() % 4 == 0;
      it.add("b" + std::to_string(i), static_cast<std::int64_t>(big ? 200 + rng() % 900 : 1 + rng() % 60),
             static_cast<double>(1 + rng() % 1000) / 1000.0);
    }
    const std::int64_t budget = static_cast<std::int64_t>(50 + rng() % 3000);
    const auto r = ctxcore::pack(it.input(), budget, opts(1, std::int64_t{1} << 30, 0, 0));
    expect_consistent(it, budget, r);
    EXPECT_NEAR(r.total_score, exact_dp(it, budget), 1e-9) << "round " << round;
  }
}

// Many large items against a small budget: a density fallback alone stops at 0.979 of the
// optimum here. After dominance only a few dozen remain and the result is proven optimal.
TEST(Packer, ManyLargeItemsAreSolvedExactly) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 4; ++round) {
    Items it;
    for (int i = 0; i < 600; ++i)
      it.add("L" + std::to_string(i), static_cast<std::int64_t>(1000 + rng() % 8001),
             static_cast<double>(rng() % 100000) / 100000.0);
    const std::int64_t budget = round % 2 == 0 ? 16000 : 32000;
    const double opt = exact_dp(it, budget);
    for (std::int64_t ceiling : {std::int64_t{1} << 20, std::int64_t{1}}) {
      const auto r = ctxcore::pack(it.input(), budget, opts(16, ceiling));
      expect_consistent(it, budget, r);
      EXPECT_GT(r.dominated, 400);
      EXPECT_GE(r.total_score, 0.999 * opt);
      if (r.proven_optimal) {
        EXPECT_NEAR(r.total_score, opt, 1e-9);
      }
    }
  }
}

}  // namespace

// ---- rank tolerance: the rank-order packing unless the optimum is materially better ----

PackOptions tolerant(double tolerance) {
  PackOptions o = opts();
  o.rank_tolerance = tolerance;
  return o;
}

TEST(PackerRankTolerance, KeepsTheRankOrderPackingWhenTheOptimumGainsLittle) {
  // One long memory ranked first against two short ones that together are worth a little
  // more: the knapsack takes the two, the rank order the long one.
  Items it;
  it.add("long", 100, 1.0);
  it.add("short1", 50, 0.505);
  it.add("short2", 50, 0.505);
  const auto exact = ctxcore::pack(it.input(), 100, opts());
  ASSERT_EQ(exact.indices.size(), 2U);
  EXPECT_FALSE(exact.rank_order);
  const auto r = ctxcore::pack(it.input(), 100, tolerant(0.05));
  expect_consistent(it, 100, r);
  EXPECT_TRUE(r.rank_order);
  ASSERT_EQ(r.indices.size(), 1U);
  EXPECT_EQ(r.indices[0], 0);
  EXPECT_EQ(r.reasons[1], Reason::BudgetExhausted);
  EXPECT_FALSE(r.proven_optimal);
}

TEST(PackerRankTolerance, TheOptimumWinsWhenItIsMateriallyBetter) {
  Items it;
  it.add("long", 100, 1.0);
  it.add("short1", 50, 0.9);
  it.add("short2", 50, 0.9);
  const auto r = ctxcore::pack(it.input(), 100, tolerant(0.05));
  expect_consistent(it, 100, r);
  EXPECT_FALSE(r.rank_order);
  EXPECT_EQ(r.indices.size(), 2U);
  EXPECT_NEAR(r.total_score, 1.8, 1e-12);
}

TEST(PackerRankTolerance, TheRankOrderSkipsWhatNoLongerFitsAndKeepsPinnedFirst) {
  Items it;
  it.add("pin", 30, 0.1, true);
  it.add("a", 50, 1.0);
  it.add("b", 40, 0.99);  // does not fit after a: skipped
  it.add("c", 20, 0.98);
  const auto r = ctxcore::pack(it.input(), 100, tolerant(0.5));
  expect_consistent(it, 100, r);
  EXPECT_EQ(r.reasons[0], Reason::Pinned);
  EXPECT_EQ(r.reasons[1], Reason::Selected);
  EXPECT_EQ(r.reasons[2], Reason::BudgetExhausted);
  EXPECT_EQ(r.reasons[3], Reason::Selected);
  EXPECT_EQ(r.tokens_used, 100);
}

TEST(PackerRankTolerance, OutOfRangeToleranceIsRejected) {
  Items it;
  it.add("a", 10, 1.0);
  for (double bad : {-0.1, 1.0, std::nan("")}) {
    EXPECT_THROW(ctxcore::pack(it.input(), 100, tolerant(bad)), std::invalid_argument);
  }
}

TEST(PackerRankTolerance, RandomPackingsStayWithinBudgetAndNearTheOptimum) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(1, 60);
  std::uniform_real_distribution<double> score(0.01, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    Items it;
    const int n = 2 + trial % 12;
    for (int i = 0; i < n; ++i) it.add("m" + std::to_string(i), tok(rng), score(rng));
    const std::int64_t budget = 20 + trial % 150;
    const double best = brute_force(it, budget);
    const auto r = ctxcore::pack(it.input(), budget, tolerant(0.02));
    expect_consistent(it, budget, r);
    EXPECT_GE(r.total_score, (1.0 - 0.02) * best - 1e-9);
  }
}

// ---- groups: at most one member of each group -------------------------------------------

struct Grouped : Items {
  std::vector<std::int64_t> groups;

  void add(std::string id, std::int64_t t, double s, std::int64_t group, bool pin = false) {
    Items::add(std::move(id), t, s, pin);
    groups.push_back(group);
  }
  ctxcore::PackInput input() {
    ctxcore::PackInput in = Items::input();
    in.groups = {groups.data(), groups.size()};
    return in;
  }
};

// The best total over packings that fit the budget and hold at most one member of each
// group, pinned candidates aside (none in the instances this is used on).
double grouped_brute_force(const Grouped& it, std::int64_t budget) {
  const std::size_t n = it.tokens.size();
  double best = 0.0;
  for (std::uint32_t mask = 0; mask < (1U << n); ++mask) {
    std::int64_t t = 0;
    double v = 0.0;
    bool ok = true;
    for (std::size_t i = 0; i < n && ok; ++i) {
      if (!(mask & (1U << i))) continue;
      t += it.tokens[i];
      v += it.scores[i];
      for (std::size_t j = 0; j < i && ok; ++j)
        ok = !(mask & (1U << j)) || it.groups[j] < 0 || it.groups[j] != it.groups[i];
    }
    if (ok && t <= budget) best = std::max(best, v);
  }
  return best;
}

// The group constraint, the budget, the result's own sums, and one reason per candidate
// that agrees with the selection: Redundant exactly for the left-out candidates (not
// pinned over budget, positive) whose group holds a selected or pinned member.
void expect_grouped_consistent(const Grouped& it, std::int64_t budget, const ctxcore::PackResult& r) {
  expect_consistent(it, budget, r);
  std::vector<char> in(it.tokens.size(), 0);
  for (std::int64_t i : r.indices) in[static_cast<std::size_t>(i)] = 1;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bool selected = r.reasons[i] == Reason::Selected || r.reasons[i] == Reason::Pinned;
    EXPECT_EQ(selected, in[i] != 0) << "candidate " << i;
    bool group_taken = false;
    for (std::size_t j = 0; j < in.size(); ++j) {
      if (j == i || it.groups[i] < 0 || it.groups[j] != it.groups[i] || !in[j]) continue;
      group_taken = true;
      EXPECT_FALSE(in[i]) << "candidates " << j << " and " << i << " share group " << it.groups[i];
    }
    if (!in[i] && r.reasons[i] != Reason::NonPositiveScore && r.reasons[i] != Reason::PinnedOverBudget) {
      EXPECT_EQ(r.reasons[i] == Reason::Redundant, group_taken) << "candidate " << i;
    }
  }
  std::int64_t redundant = 0;
  for (Reason reason : r.reasons) redundant += reason == Reason::Redundant ? 1 : 0;
  EXPECT_EQ(redundant, r.redundant);
}

TEST(PackerGroups, OneMemberOfAGroupIsSelectedAndTheOthersAreRedundant) {
  Grouped it;
  it.add("a", 10, 5.0, 7);
  it.add("a-copy", 10, 4.9, 7);
  it.add("b", 10, 1.0, -1);
  it.add("a-longer", 30, 5.5, 7);
  const auto r = ctxcore::pack(it.input(), 1000, opts());
  expect_grouped_consistent(it, 1000, r);
  ASSERT_EQ(r.indices.size(), 2U);
  EXPECT_EQ(r.indices[0], 3);  // the group's most valuable member: room is no object
  EXPECT_EQ(r.indices[1], 2);
  EXPECT_EQ(r.reasons[0], Reason::Redundant);
  EXPECT_EQ(r.reasons[1], Reason::Redundant);
  EXPECT_EQ(r.redundant, 2);
  EXPECT_EQ(r.excluded_for_budget, 0);
  EXPECT_FALSE(r.truncated);  // nothing was left out for lack of room
  EXPECT_TRUE(r.proven_optimal);
}

TEST(PackerGroups, TheLighterMemberWinsWhenRoomIsShort) {
  Grouped it;
  it.add("long", 60, 1.0, 0);
  it.add("short", 30, 0.9, 0);
  it.add("other", 40, 0.8, -1);
  const auto r = ctxcore::pack(it.input(), 70, opts());
  expect_grouped_consistent(it, 70, r);
  ASSERT_EQ(r.indices.size(), 2U);
  EXPECT_EQ(r.indices[0], 1);
  EXPECT_EQ(r.indices[1], 2);
  EXPECT_EQ(r.reasons[0], Reason::Redundant);
  EXPECT_NEAR(r.total_score, 1.7, 1e-12);
}

TEST(PackerGroups, AllCandidatesInNoGroupGiveTheUngroupedResult) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 50; ++round) {
    Grouped it;
    for (int i = 0; i < 200; ++i)
      it.add("m" + std::to_string(i), static_cast<std::int64_t>(rng() % 400), static_cast<double>(rng() % 1000) / 999.0,
             -1, rng() % 40 == 0);
    const std::int64_t budget = static_cast<std::int64_t>(rng() % 20000);
    const auto plain = ctxcore::pack(it.Items::input(), budget, opts());
    const auto grouped = ctxcore::pack(it.input(), budget, opts());
    EXPECT_EQ(plain.indices, grouped.indices);
    EXPECT_EQ(plain.reasons, grouped.reasons);
    EXPECT_EQ(plain.path, grouped.path);
    EXPECT_EQ(plain.total_score, grouped.total_score);
    EXPECT_EQ(grouped.redundant, 0);
  }
}

TEST(PackerGroups, PinnedMembersClaimTheirGroup) {
  Grouped it;
  it.add("pin", 10, 0.2, 3, true);
  it.add("pin-copy", 10, 0.1, 3, true);
  it.add("better", 10, 0.9, 3);
  it.add("pin-too-big", 500, 0.5, 4, true);
  it.add("four", 10, 0.4, 4);
  const auto r = ctxcore::pack(it.input(), 100, opts());
  expect_grouped_consistent(it, 100, r);
  EXPECT_EQ(r.reasons[0], Reason::Pinned);
  EXPECT_EQ(r.reasons[1], Reason::Redundant);  // pinned, but its group is already in
  EXPECT_EQ(r.reasons[2], Reason::Redundant);
  EXPECT_EQ(r.reasons[3], Reason::PinnedOverBudget);
  EXPECT_EQ(r.reasons[4], Reason::Selected);  // the pinned one did not fit: the group is open
  EXPECT_TRUE(r.truncated);
}

TEST(PackerGroups, AZeroTokenMemberIsTakenUnlessAMemberWithTokensIsWorthMore) {
  Grouped it;
  it.add("free", 0, 0.5, 1);
  it.add("free-copy", 0, 0.4, 1);
  it.add("full", 50, 0.9, 1);
  it.add("weak", 20, 0.3, 1);  // worth less than the free member: never chosen
  it.add("solo-free", 0, 0.1, -1);
  auto r = ctxcore::pack(it.input(), 100, opts());
  expect_grouped_consistent(it, 100, r);
  EXPECT_EQ(r.reasons[2], Reason::Selected);
  EXPECT_EQ(r.reasons[0], Reason::Redundant);
  EXPECT_EQ(r.reasons[1], Reason::Redundant);
  EXPECT_EQ(r.reasons[3], Reason::Redundant);
  EXPECT_EQ(r.reasons[4], Reason::Selected);
  EXPECT_GE(r.upper_bound, r.total_score);
  r = ctxcore::pack(it.input(), 40, opts());
  expect_grouped_consistent(it, 40, r);
  EXPECT_EQ(r.reasons[0], Reason::Selected);
  EXPECT_EQ(r.reasons[2], Reason::Redundant);
  EXPECT_NEAR(r.total_score, 0.6, 1e-12);
}

TEST(PackerGroups, BadGroupsAreRejected) {
  Grouped it;
  it.add("a", 10, 1.0, 0);
  it.add("b", 10, 1.0, -2);
  try {
    ctxcore::pack(it.input(), 100, opts());
    FAIL() << "expected InvalidCandidate";
  } catch (const ctxcore::InvalidCandidate& e) {
    EXPECT_EQ(e.index(), 1);
    EXPECT_NE(std::string(e.what()).find("group"), std::string::npos);
  }
  it.groups.pop_back();
  try {
    ctxcore::pack(it.input(), 100, opts());
    FAIL() << "expected InvalidCandidate";
  } catch (const ctxcore::InvalidCandidate& e) {
    EXPECT_EQ(e.index(), -1);
    EXPECT_NE(std::string(e.what()).find("1 groups"), std::string::npos);
  }
}

// Every path of the grouped solver against the brute-force optimum: the exact DP over
// groups, the DP over buckets with repair and refill, the fallback with swaps, each with
// and without the search.
TEST(PackerGroups, RandomSmallInstancesAgainstBruteForce) {
  std::mt19937_64 rng(2024);
  const std::vector<PackOptions> variants = {
      opts(),                       // exact DP over groups
      opts(16, 1 << 16, 20000, 0),  // buckets, then the search
      opts(16, 1 << 16, 0, 0),      // buckets alone
      opts(16, 1, 20000, 0),        // fallback, then the search
      opts(16, 1, 0, 1 << 12),      // fallback with the fine DP, no search
  };
  std::vector<double> worst(variants.size(), 1.0);
  for (int round = 0; round < 2000; ++round) {
    Grouped it;
    const int n = 1 + static_cast<int>(rng() % 13);
    const int kinds = 1 + static_cast<int>(rng() % 5);
    const bool large = round % 2 == 0;
    for (int i = 0; i < n; ++i) {
      const auto group = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(kinds + 1)) - 1;
      const auto t = static_cast<std::int64_t>(rng() % (large ? 4000 : 120));
      // Every third round, scores on one line through the tokens: each group's hull is
      // collinear, and rounding may order its segments either way.
      const double score = round % 3 == 0 ? static_cast<double>(t) / 100.0 + 0.1
                                          : static_cast<double>(rng() % 1000) / 100.0 - (rng() % 12 == 0 ? 3.0 : 0.0);
      it.add("c" + std::to_string(i), t, score, group);
    }
    const std::int64_t budget = static_cast<std::int64_t>(rng() % (large ? 12000 : 400));
    const double opt = grouped_brute_force(it, budget);
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const auto r = ctxcore::pack(it.input(), budget, variants[v]);
      expect_grouped_consistent(it, budget, r);
      EXPECT_LE(r.total_score, opt + 1e-9) << "round " << round;
      EXPECT_GE(r.upper_bound, opt - 1e-9) << "round " << round;
      if (r.proven_optimal) {
        EXPECT_NEAR(r.total_score, opt, 1e-9) << "round " << round << " variant " << v;
      }
      if (variants[v].search_node_limit > 0) {
        EXPECT_TRUE(r.proven_optimal) << "round " << round << " variant " << v;
      }
      if (opt > 0) worst[v] = std::min(worst[v], r.total_score / opt);
    }
  }
  EXPECT_GE(worst[0], 1.0 - 1e-12);
  EXPECT_GE(worst[1], 1.0 - 1e-12);
  EXPECT_GE(worst[3], 1.0 - 1e-12);
  std::printf("worst of the optimum without the search: buckets %.4f, fallback %.4f\n", worst[2], worst[4]);
  EXPECT_GE(worst[2], 0.9);  // one bucket DP, repair, refill: no search to finish the job
  EXPECT_GE(worst[4], 0.9);
}

// Larger sets: realistic memories with near-duplicate clusters, through every path; the
// constraint, the budget and the reasons always hold, and the result does not depend on
// the input order.
TEST(PackerGroups, MidSizeSetsKeepTheConstraintAndTheOrder) {
  std::mt19937_64 rng(77);
  for (int round = 0; round < 40; ++round) {
    Grouped it;
    const int n = 50 + static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) {
      const std::int64_t group = rng() % 3 == 0 ? static_cast<std::int64_t>(rng() % 30) : -1;
      const auto t = static_cast<std::int64_t>(rng() % 10 == 0 ? 0 : 20 + rng() % 600);
      const double score = round % 2 == 0 ? static_cast<double>(t) / 100.0 + 0.1  // collinear hulls
                                          : static_cast<double>(rng() % 10000) / 10000.0;
      it.add("m" + std::to_string(i), t, score, group, rng() % 50 == 0);
    }
    const std::int64_t budget = static_cast<std::int64_t>(rng() % 30000);
    PackOptions tol = opts();
    tol.rank_tolerance = 0.05;
    for (const PackOptions& o : {opts(), opts(16, 1), opts(16, 1 << 20, 0, 0), tol}) {
      const auto a = ctxcore::pack(it.input(), budget, o);
      expect_grouped_consistent(it, budget, a);
      std::vector<std::size_t> perm(it.names.size());
      for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      Grouped shuffled;
      for (std::size_t p : perm) shuffled.add(it.names[p], it.tokens[p], it.scores[p], it.groups[p], it.pinned[p] != 0);
      const auto b = ctxcore::pack(shuffled.input(), budget, o);
      ASSERT_EQ(a.indices.size(), b.indices.size());
      for (std::size_t k = 0; k < a.indices.size(); ++k)
        EXPECT_EQ(it.names[static_cast<std::size_t>(a.indices[k])],
                  shuffled.names[static_cast<std::size_t>(b.indices[k])]);
      for (std::size_t k = 0; k < perm.size(); ++k) EXPECT_EQ(a.reasons[perm[k]], b.reasons[k]);
      EXPECT_EQ(a.path, b.path);
    }
  }
}

TEST(PackerGroups, RankToleranceKeepsOneMemberPerGroup) {
  Grouped it;
  it.add("a", 40, 1.0, 0);
  it.add("a-copy", 40, 0.99, 0);
  it.add("b", 60, 0.5, -1);
  PackOptions o = opts();
  o.rank_tolerance = 0.5;
  const auto r = ctxcore::pack(it.input(), 100, o);
  expect_grouped_consistent(it, 100, r);
  EXPECT_EQ(r.reasons[1], Reason::Redundant);
  EXPECT_EQ(r.tokens_used, 100);
}

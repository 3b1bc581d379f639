// Unit tests of the C++ packer, run through ctest (also under ASan + UBSan in CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
    EXPECT_EQ(it.names[static_cast<std::size_t>(a.indices[k])],
              shuffled.names[static_cast<std::size_t>(b.indices[k])]);
  }
}

}  // namespace

// The 0/1 knapsack packer: given scored candidates with exact token costs and a hard
// budget, choose the subset with the largest total score whose exact token sum fits.
// It sits between scoring and formatting: everything upstream decides what a candidate is
// worth, everything downstream serializes what this picks. Plain C++17, no Python.
//
// The pipeline (one function per step in packer.cpp):
//   1. validate, then rank by descending score, then id (deterministic ties);
//   2. take pinned candidates first, in rank order, while they fit;
//   3. exact reductions, which never change the optimum: dominance (drop an item when the
//      items at least as light and at least as valuable could not all be packed beside
//      it), then bound fixing (an item whose LP bound with it forced in, or out, cannot
//      beat the value-density packing is fixed out, or in);
//   4. on what is left free: the exact optimum when it is cheap (a DP on exact token
//      counts, as a table or over Pareto states when few items fit together); else DP
//      over token buckets while the reduced set's table stays under the cell ceiling,
//      else a value-density fallback;
//   5. repair so the exact token sum never exceeds the budget;
//   6. refill the exact slack and improve: an exact DP on exact token counts over the
//      core of items around the density break, 1-for-1 swaps, then a bounded
//      branch-and-bound that proves optimality when it finishes;
//   7. emit in deterministic order (pinned, then the rest, each by rank).
//
// With groups (PackInput::groups), at most one member of each group is selected: a
// multiple-choice knapsack. Pinned members claim their group first; within a group, a
// member that a lighter-or-equal, at-least-as-valuable member dominates is never needed;
// when that leaves no group with two members the steps above run unchanged, else the
// same steps run group-aware: bound fixing on the multiple-choice LP (each group's convex
// hull), the DP over groups, repair, refill, swaps and the search all keep one member per
// group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ctxcore {

// Input limits. 2^40 tokens is ~10^4 times the largest context window that exists;
// with at most 2^22 candidates every sum of tokens stays below 2^62, so all token
// arithmetic is exact int64 without overflow checks in the hot loops.
inline constexpr std::int64_t kMaxTokens = std::int64_t{1} << 40;
inline constexpr std::size_t kMaxCandidates = std::size_t{1} << 22;

// Bad input to the packer. `index` is the offending candidate's input position
// (or -1 when the problem is not one candidate's, e.g. mismatched lengths).
class InvalidCandidate : public std::invalid_argument {
 public:
  InvalidCandidate(const std::string& message, std::int64_t index, std::string candidate_id)
      : std::invalid_argument(message), index_(index), candidate_id_(std::move(candidate_id)) {}
  std::int64_t index() const noexcept { return index_; }
  const std::string& candidate_id() const noexcept { return candidate_id_; }

 private:
  std::int64_t index_;
  std::string candidate_id_;
};

// A read-only view of `size` contiguous elements (std::span is C++20).
template <class T>
struct View {
  const T* data = nullptr;
  std::size_t size = 0;
  const T& operator[](std::size_t i) const { return data[i]; }
};

// Every knob comes from the caller: the core holds no policy defaults.
struct PackOptions {
  std::int64_t bucket_tokens = 0;      // DP granularity in tokens, > 0
  std::int64_t cell_ceiling = 0;       // max DP cells (items x buckets), > 0
  std::int64_t search_node_limit = 0;  // branch-and-bound nodes, >= 0 (0 = no search)
  std::int64_t core_cell_limit = 0;    // exact core DP cells, >= 0 (0 = no core step)
  // In [0, 1): when > 0, the rank-order packing (candidates by score, each that still
  // fits) is kept unless the optimized packing is worth more than 1 / (1 - tolerance)
  // times it. 0: the optimized packing always.
  double rank_tolerance = 0.0;
};

enum class PackPath : std::uint8_t { Trivial = 0, Dp = 1, Greedy = 2 };

// Why each candidate ended up where it did. Values are stable: Python mirrors them.
enum class Reason : std::uint8_t {
  Selected = 0,          // chosen by the optimizer (or everything fit)
  Pinned = 1,            // pinned and taken before optimization
  BudgetExhausted = 2,   // left out: no room in the best packing found
  PinnedOverBudget = 3,  // pinned, but did not fit in what the earlier pinned left
  NonPositiveScore = 4,  // score <= 0: adding it can never raise the objective
  Redundant = 5,         // left out: another member of its group is selected or pinned
};

struct PackInput {
  View<std::string_view> ids;
  View<std::int64_t> tokens;
  View<double> scores;
  View<std::uint8_t> pinned;  // size 0 means "none pinned"
  // Size 0 means "no groups". Else one per candidate: -1 for none, any value >= 0 names a
  // group (candidates with equal values: near-duplicates, at most one of them selected).
  View<std::int64_t> groups;
};

struct PackResult {
  std::vector<std::int64_t> indices;  // selected input positions, emit order
  std::vector<Reason> reasons;        // one per input candidate, input order
  std::int64_t tokens_used = 0;
  double total_score = 0.0;
  double upper_bound = 0.0;  // LP relaxation bound; total_score <= upper_bound
  bool rank_order = false;   // the rank-order packing was kept (PackOptions::rank_tolerance)
  PackPath path = PackPath::Trivial;
  std::int64_t evaluated = 0;
  std::int64_t excluded_for_budget = 0;
  bool truncated = false;
  bool proven_optimal = false;  // the selection is an exact optimum for this input
  std::int64_t dp_cells = 0;    // DP table size actually used (0 when no DP ran)
  std::int64_t search_nodes = 0;
  std::int64_t dominated = 0;   // pool items removed by dominance (left out, never needed)
  std::int64_t free_items = 0;  // pool items left undecided by the exact reductions
  std::int64_t redundant = 0;   // candidates left out as Reason::Redundant
};

// Throws InvalidCandidate for bad candidates and std::invalid_argument for bad options.
PackResult pack(const PackInput& input, std::int64_t budget, const PackOptions& options);

}  // namespace ctxcore

// libFuzzer harness for the token estimator. Built with -DCTXCORE_BUILD_FUZZERS=ON and clang;
// tools/run-tests runs it for a bounded time.
//
// The input bytes become a text of code points from every range (ASCII, Latin-1, the BMP
// with its surrogates, the planes past it, runs of one code point), priced with families
// of random costs, a class for every code point and a vocabulary of words drawn from such
// texts. Any crash, sanitizer report or broken invariant aborts. Invariants:
//   - the scan (both forms of its inner loops) gives the walk's raw cost, in the text's
//     narrowest width, as UCS-4 and (below 256) as UCS-2;
//   - the estimate never drops when the text grows (checked at a few of its prefixes);
//   - every word the walk reports found is a vocabulary word, and every vocabulary word
//     it meets is found.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ctxcore/estimator.hpp"
#include "utf8.hpp"

namespace {

using ctxcore_testing::utf8;

// Aborts (which libFuzzer reports with the input) naming the broken invariant.
#define check(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz_estimator.cpp:%d: invariant broken: %s\n", __LINE__, #cond); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

// One family: random costs, a class for every code point from a hash of it (ASCII as
// Unicode has it), the vocabulary `words`. Two word modes and two word prices.
struct Family {
  ctxcore::EstimatorParams scanned, baseline;
  std::set<std::u32string> vocabulary;
};

std::vector<Family> make_families() {
  std::mt19937 rng(2026);
  std::vector<std::uint8_t> classes(ctxcore::kClassLimit);
  for (std::size_t cp = 0; cp < classes.size(); ++cp) {
    const unsigned r = ((static_cast<std::uint32_t>(cp) * 0x9E3779B1u) >> 24) % 16;
    classes[cp] = static_cast<std::uint8_t>(r < 3    ? ctxcore::kClassLower
                                            : r < 6  ? ctxcore::kClassUpper
                                            : r < 9  ? ctxcore::kClassLetterOther
                                            : r < 10 ? ctxcore::kClassMark
                                            : r < 11 ? ctxcore::kClassNumber
                                            : r < 12 ? ctxcore::kClassSpace
                                                     : ctxcore::kClassOther);
  }
  for (char32_t cp = 0; cp < 0x80; ++cp) {
    classes[cp] = cp >= 'a' && cp <= 'z'                                ? ctxcore::kClassLower
                  : cp >= 'A' && cp <= 'Z'                              ? ctxcore::kClassUpper
                  : cp >= '0' && cp <= '9'                              ? ctxcore::kClassNumber
                  : cp == '\n' || cp == '\r'                            ? ctxcore::kClassNewline
                  : cp == ' ' || cp == '\t' || cp == '\v' || cp == '\f' ? ctxcore::kClassSpace
                                                                        : ctxcore::kClassOther;
  }
  // Words: runs of letters of a few scripts, some with a leading space or punctuation.
  const std::u32string letters[] = {U"etaoinshrdlu",
                                    U"ETAOIN",
                                    U"\u00e9\u00fc\u00df\u00e0\u00c9",
                                    U"\u0430\u0431\u0432\u0433",
                                    U"\u4e2d\u6587\u672c",
                                    U"\U00020000\U00020001"};
  std::set<std::u32string> vocabulary;
  for (int i = 0; i < 3000; ++i) {
    std::u32string w = rng() % 3 == 0 ? U" " : rng() % 4 == 0 ? U"(" : U"";
    const auto& script = letters[rng() % 6];
    const std::size_t n = 1 + rng() % 8;
    for (std::size_t k = 0; k < n; ++k) w += script[rng() % script.size()];
    vocabulary.insert(w);
  }
  for (const auto& script : letters)
    for (const char32_t c : script) vocabulary.insert(std::u32string(1, c));
  std::string words;
  for (const auto& w : vocabulary) words += (words.empty() ? "" : std::string(1, '\0')) + utf8(w);
  std::vector<Family> families;
  for (const unsigned mode : {ctxcore::kWordsCl100k, ctxcore::kWordsO200k}) {
    for (const std::uint32_t cost : {700u, 1024u}) {
      ctxcore::EstimatorParams p;
      p.pair_bits = 12;
      p.latin_costs.resize(ctxcore::kLatinPairs);
      for (auto& c : p.latin_costs)
        c = rng() % 5 == 0 ? ctxcore::kUnseenPair : static_cast<std::uint16_t>(rng() % 3000);
      p.pair_entries.resize(std::size_t{1} << p.pair_bits);
      for (auto& e : p.pair_entries) e = static_cast<std::uint32_t>((rng() % 65536) << 16 | (rng() % 3000));
      p.block_costs.resize(ctxcore::kBlocks);
      for (auto& c : p.block_costs) c = static_cast<std::uint16_t>(rng() % 3000);
      p.scale = 1.13;
      p.spread = 1.7;
      ctxcore::set_words(p, mode, classes, words, cost);
      ctxcore::prepare(p);
      Family f{p, p, vocabulary};
      f.baseline.scan.avx2 = false;
      families.push_back(std::move(f));
    }
  }
  return families;
}

// A code point from the input: mostly letters and spaces of the vocabulary's scripts, and
// anything at all.
char32_t next_code_point(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      return fdp.ConsumeIntegralInRange<char32_t>(0, 0x7F);
    case 1:
      return fdp.ConsumeIntegralInRange<char32_t>(0x80, 0xFF);
    case 2:
      return fdp.ConsumeIntegralInRange<char32_t>(0, 0xFFFF);  // surrogates included
    case 3:
      return fdp.ConsumeIntegralInRange<char32_t>(0x10000, 0x10FFFF);
    case 4:
      return U" \n.(x"[fdp.ConsumeIntegralInRange<int>(0, 4)];
    default: {
      static const char32_t kLetters[] =
          U"etaoinshrdluETAOIN\u00e9\u00fc\u00df\u00e0\u00c9\u0430\u0431\u0432\u0433"
          U"\u4e2d\u6587\u672c\U00020000\U00020001";
      return kLetters[fdp.ConsumeIntegralInRange<std::size_t>(0, sizeof(kLetters) / sizeof(char32_t) - 2)];
    }
  }
}

ctxcore::RawCost walked(const std::u32string& s, const ctxcore::EstimatorParams& p) {
  return ctxcore::raw_cost_walked(ctxcore::CodePoints{s.data(), s.size(), 4}, p);
}

void check_text(const std::u32string& s, const Family& f) {
  const ctxcore::RawCost want = walked(s, f.scanned);
  char32_t top = 0;
  for (const char32_t c : s) top = std::max(top, c);
  std::vector<std::uint8_t> u8;
  std::vector<std::uint16_t> u16;
  std::vector<ctxcore::CodePoints> forms = {{s.data(), s.size(), 4}};
  if (top < 0x10000) {
    u16.assign(s.begin(), s.end());
    forms.push_back({u16.data(), u16.size(), 2});
  }
  if (top < 0x100) {
    u8.assign(s.begin(), s.end());
    forms.push_back({u8.data(), u8.size(), 1});
  }
  for (const auto& form : forms) {
    for (const ctxcore::EstimatorParams* p : {&f.scanned, &f.baseline}) {
      const ctxcore::RawCost got = ctxcore::raw_cost(form, *p);
      check(got.units == want.units);
      check(got.sure == want.sure);
    }
  }
  ctxcore::for_each_word(
      ctxcore::CodePoints{s.data(), s.size(), 4}, f.scanned,
      [&](std::size_t b, std::size_t e, bool found) { check(found == (f.vocabulary.count(s.substr(b, e - b)) == 1)); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<Family> families = make_families();
  FuzzedDataProvider fdp(data, size);
  const Family& f = families[fdp.ConsumeIntegralInRange<std::size_t>(0, families.size() - 1)];
  std::u32string s;
  while (fdp.remaining_bytes() > 0 && s.size() < 20000) {
    const char32_t c = next_code_point(fdp);
    // Sometimes a long run of it: words and digit groups across the scan's segments.
    const std::size_t run = fdp.ConsumeBool() ? 1 : fdp.ConsumeIntegralInRange<std::size_t>(1, 1500);
    s.append(run, c);
  }
  check_text(s, f);
  // Never lower for a longer text: a few prefixes, each priced no higher than the whole.
  const std::int64_t whole = ctxcore::estimate_tokens(ctxcore::CodePoints{s.data(), s.size(), 4}, f.scanned);
  for (const std::size_t n : {s.size() / 3, s.size() / 2, s.size() - std::min<std::size_t>(s.size(), 1)}) {
    check(ctxcore::estimate_tokens(ctxcore::CodePoints{s.data(), n, 4}, f.scanned) <= whole);
  }
  return 0;
}

// Unit tests of the C++ token estimator, run through ctest (also under ASan + UBSan in CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ctxcore/estimator.hpp"
#include "utf8.hpp"

namespace {

using ctxcore_testing::utf8;

using ctxcore::EstimatorParams;

constexpr std::uint16_t kOne = static_cast<std::uint16_t>(ctxcore::kCostUnit);

// Every Latin-1 pair costs `latin` units (or is unseen), the hashed table is empty, and
// every block costs `block` units.
EstimatorParams params(unsigned bits, std::uint16_t latin, std::uint16_t block, double scale = 1.0,
                       double spread = 0.0) {
  EstimatorParams p;
  p.pair_bits = bits;
  p.latin_costs.assign(ctxcore::kLatinPairs, latin);
  p.pair_entries.assign(std::size_t{1} << bits, ctxcore::kUnseenPair);
  p.block_costs.assign(ctxcore::kBlocks, block);
  p.scale = scale;
  p.spread = spread;
  return p;
}

std::int64_t est(const std::string& s, const EstimatorParams& p) { return ctxcore::estimate_tokens(s, p); }

// Random costs in every table of `p`: a fifth of the Latin-1 pairs unseen, the hashed
// pairs under random keys.
void random_costs(EstimatorParams& p, std::mt19937& rng) {
  for (auto& c : p.latin_costs) c = (rng() % 5 == 0) ? ctxcore::kUnseenPair : static_cast<std::uint16_t>(rng() % 3000);
  for (auto& e : p.pair_entries) e = static_cast<std::uint32_t>((rng() % 65536) << 16 | (rng() % 3000));
  for (auto& c : p.block_costs) c = static_cast<std::uint16_t>(rng() % 3000);
}

TEST(Estimator, EmptyTextIsZeroNonEmptyAtLeastOne) {
  const auto p = params(4, 0, 0, 1.2, 3.0);
  EXPECT_EQ(est("", p), 0);
  EXPECT_EQ(est("a", p), 1);  // every cost is 0, yet a non-empty text is at least 1 token
  EXPECT_EQ(est(std::string(1000, ' '), p), 1);
}

TEST(Estimator, SumsPairCosts) {
  const auto p = params(4, kOne, kOne);
  EXPECT_EQ(est("hello world", p), 11);
  EXPECT_EQ(est("\xE6\x97\xA5\xE6\x9C\xAC", p), 2);  // 日本: two code points
  EXPECT_EQ(est("\xF0\x9F\x8E\x89", p), 1);          // 🎉
}

TEST(Estimator, UnseenPairsFallBackToTheBlock) {
  auto p = params(3, ctxcore::kUnseenPair, 0);
  p.block_costs[ctxcore::block_of(U'a')] = 2 * kOne;  // a-z share a block
  p.block_costs[ctxcore::block_of(U'\u65E5')] = 3 * kOne;
  EXPECT_EQ(est("ab", p), 4);
  EXPECT_EQ(est("\xE6\x97\xA5", p), 3);
  // A seen pair overrides the block.
  p.latin_costs[ctxcore::pair_slot(0, U'a', 3).index] = kOne / 2;
  EXPECT_EQ(est("ab", p), 3);  // ceil(0.5 + 2)
}

TEST(Estimator, LatinPairsAreDirectOthersHashedWithTags) {
  const auto ab = ctxcore::pair_slot(U'a', U'b', 10);
  EXPECT_TRUE(ab.direct);
  EXPECT_EQ(ab.index, (std::size_t{'a'} << 8) | 'b');
  EXPECT_EQ(ctxcore::pair_slot(0, 0xE9, 10).index, std::size_t{0xE9});
  for (char32_t prev : {char32_t{0}, char32_t{'x'}, char32_t{0x4E2D}}) {
    for (char32_t cp : {char32_t{0x100}, char32_t{0x65E5}, char32_t{0x1F389}}) {
      const auto slot = ctxcore::pair_slot(prev, cp, 10);
      EXPECT_FALSE(slot.direct);
      EXPECT_LT(slot.index, std::size_t{1024});
      EXPECT_LE(slot.tag, 0xFFFFu);
    }
  }
  // Every Latin-1 pair has its own entry: setting one changes only texts with that pair.
  auto p = params(4, 0, 0);
  p.latin_costs[ab.index] = 7 * kOne;
  EXPECT_EQ(est("ab", p), 7);
  EXPECT_EQ(est("ba", p), 1);
  EXPECT_EQ(est("cab", p), 7);
  // A hashed entry applies only to the pair whose tag it carries.
  auto q = params(4, 0, kOne);
  const auto slot = ctxcore::pair_slot(0x65E5, 0x672C, 4);  // 日本
  q.pair_entries[slot.index] = (slot.tag << 16) | (5u * kOne);
  EXPECT_EQ(est("\xE6\x97\xA5\xE6\x9C\xAC", q), 1 + 5);
  q.pair_entries[slot.index] = ((slot.tag ^ 1u) << 16) | (5u * kOne);
  EXPECT_EQ(est("\xE6\x97\xA5\xE6\x9C\xAC", q), 2);  // another pair's entry: the block cost
}

TEST(Estimator, CodePointFormsAgreeWithUtf8) {
  std::mt19937 rng(3);
  auto p = params(10, 0, 0, 1.1, 0.7);
  for (auto& c : p.latin_costs) c = static_cast<std::uint16_t>(rng() % 3000);
  for (auto& e : p.pair_entries) e = static_cast<std::uint32_t>(rng());
  for (auto& c : p.block_costs) c = static_cast<std::uint16_t>(rng() % 3000);
  const std::u32string text = U"Grüße, 世界! \U0001F389 ok\n\tx = 12345;";
  const ctxcore::CodePoints wide{text.data(), text.size(), 4};
  EXPECT_EQ(ctxcore::estimate_tokens(wide, p), est(utf8(text), p));
  const std::vector<std::uint8_t> latin1 = {'c', 'a', 'f', 0xE9};
  const ctxcore::CodePoints narrow{latin1.data(), latin1.size(), 1};
  EXPECT_EQ(ctxcore::estimate_tokens(narrow, p), est("caf\xC3\xA9", p));
  const std::vector<std::uint16_t> ucs2 = {0x65E5, 0x672C};
  const ctxcore::CodePoints mid{ucs2.data(), ucs2.size(), 2};
  EXPECT_EQ(ctxcore::estimate_tokens(mid, p), est("\xE6\x97\xA5\xE6\x9C\xAC", p));
}

TEST(Estimator, InvalidUtf8CountsAsReplacementCharacters) {
  auto p = params(4, ctxcore::kUnseenPair, 0);
  p.block_costs[ctxcore::block_of(0xFFFD)] = 5 * kOne;
  // Truncated sequences, overlong forms, surrogates, values past U+10FFFF, stray bytes.
  const std::vector<std::pair<std::string, std::int64_t>> cases = {
      {"\xC3", 5}, {"\xE6\x97", 10}, {"\xC0\xAF", 10}, {"\xED\xA0\x80", 15}, {"\xF4\x90\x80\x80", 20}, {"\x80", 5}};
  for (const auto& [s, want] : cases) EXPECT_EQ(est(s, p), want) << s.size();
}

TEST(Estimator, MarginFormula) {
  const auto p = params(2, 2 * kOne, 0, 1.5, 1.0);
  // Four code points: raw = 8; ceil(1.5 * 8 + sqrt(8)) = ceil(14.83) = 15.
  EXPECT_EQ(est("abcd", p), 15);
}

TEST(Estimator, MonotoneUnderAppend) {
  std::mt19937 rng(7);
  auto p = params(8, 0, 0, 1.13, 1.7);
  for (auto& c : p.latin_costs) c = (rng() % 5 == 0) ? ctxcore::kUnseenPair : static_cast<std::uint16_t>(rng() % 4000);
  for (auto& e : p.pair_entries) e = static_cast<std::uint32_t>((rng() % 65536) << 16 | (rng() % 4000));
  for (auto& c : p.block_costs) c = static_cast<std::uint16_t>(rng() % 4000);
  const std::vector<std::string> pieces = {
      "a",        "Z",  " ",   "  ", "\n", "7", ",", "...", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
      "\xCC\x81", "\t", "\xFF"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    std::int64_t last = 0;
    for (int step = 0; step < 40; ++step) {
      s += pieces[rng() % pieces.size()];
      const auto e = est(s, p);
      ASSERT_GE(e, last) << s;
      last = e;
    }
  }
}

TEST(Estimator, BatchMatchesSingle) {
  const std::vector<std::string> texts = {"", "hello", "\xE4\xB8\xAD\xE6\x96\x87", "x = f(y) + 12345;\n"};
  std::vector<std::string_view> views(texts.begin(), texts.end());
  std::vector<std::int64_t> out(texts.size(), -1);
  auto p = params(6, 700, 900, 1.1, 0.5);
  p.latin_costs[5] = ctxcore::kUnseenPair;
  ctxcore::estimate_tokens_batch({views.data(), views.size()}, p, out.data());
  for (std::size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(out[i], est(texts[i], p));
}

TEST(Estimator, ValidateRejectsBadParams) {
  EXPECT_NO_THROW(ctxcore::validate(params(4, 1, 1)));
  EXPECT_THROW(ctxcore::validate(params(0, 1, 1)), std::invalid_argument);
  EXPECT_THROW(ctxcore::validate(params(25, 1, 1)), std::invalid_argument);
  auto p = params(4, 1, 1);
  p.pair_entries.pop_back();
  EXPECT_THROW(ctxcore::validate(p), std::invalid_argument);
  p = params(4, 1, 1);
  p.latin_costs.push_back(1);
  EXPECT_THROW(ctxcore::validate(p), std::invalid_argument);
  p = params(4, 1, 1);
  p.block_costs.push_back(1);
  EXPECT_THROW(ctxcore::validate(p), std::invalid_argument);
  EXPECT_THROW(ctxcore::validate(params(4, 1, ctxcore::kUnseenPair)), std::invalid_argument);
  EXPECT_THROW(ctxcore::validate(params(4, 1, 1, -1.0)), std::invalid_argument);
  EXPECT_THROW(ctxcore::validate(params(4, 1, 1, std::numeric_limits<double>::quiet_NaN())), std::invalid_argument);
  EXPECT_THROW(ctxcore::validate(params(4, 1, 1, 1.0, std::numeric_limits<double>::infinity())), std::invalid_argument);
}

TEST(Estimator, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(est("abc", params(4, kOne, 0, 1e300)), static_cast<std::int64_t>(9.0e18));
}

// ---- the word model ----------------------------------------------------------------------

// ASCII classes as the pre-tokenizer patterns see them; everything else is "other", except
// U+00E9 (lower) and U+0301 (a combining mark).
std::vector<std::uint8_t> ascii_classes() {
  std::vector<std::uint8_t> c(ctxcore::kClassLimit, ctxcore::kClassOther);
  for (char32_t x = 'a'; x <= 'z'; ++x) c[x] = ctxcore::kClassLower;
  for (char32_t x = 'A'; x <= 'Z'; ++x) c[x] = ctxcore::kClassUpper;
  for (char32_t x = '0'; x <= '9'; ++x) c[x] = ctxcore::kClassNumber;
  c[0xE9] = ctxcore::kClassLower;
  c[0x301] = ctxcore::kClassMark;
  c[' '] = c['\t'] = ctxcore::kClassSpace;
  c['\n'] = c['\r'] = ctxcore::kClassNewline;
  return c;
}

// `words` separated by '\n' here for legibility; set_words takes them separated by NUL.
EstimatorParams with_words(EstimatorParams p, unsigned mode, std::string words, std::uint32_t cost = kOne) {
  for (char& c : words)
    if (c == '\n') c = '\0';
  ctxcore::set_words(p, mode, ascii_classes(), words, cost);
  ctxcore::validate(p);
  return p;
}

std::int64_t est32(const std::u32string& s, const EstimatorParams& p) {
  return ctxcore::estimate_tokens(ctxcore::CodePoints{s.data(), s.size(), 4}, p);
}

TEST(EstimatorWords, VocabularyWordsCostTheWordPrice) {
  const auto p = with_words(params(4, kOne, kOne), ctxcore::kWordsCl100k, "hello\n world\n(a\nx");
  EXPECT_EQ(est("hello world", p), 2);           // "hello", " world": one token each
  EXPECT_EQ(est("hellx world", p), 5 + 1);       // not a word: its pair costs
  EXPECT_EQ(est("hello  world", p), 1 + 1 + 1);  // the second space attaches to " world"
  EXPECT_EQ(est("b(a", p), 2 + 1);               // "(" after a word begins a chunk and attaches to "a"
  EXPECT_EQ(est("b (a", p), 2 + 1 + 1 + 2);      // " (" is a punctuation chunk: "a" alone is no word
  EXPECT_EQ(est("12x", p), 1 + 1);               // a number is never attached
  // A vocabulary word costs the word price however little its pairs sum to: its pairs are
  // averages over other contexts, the word is one chunk and one token.
  const auto cheap = with_words(params(4, kOne / 4, kOne / 4), ctxcore::kWordsCl100k, "x\nhello", 3 * kOne);
  EXPECT_EQ(est("hello", cheap), 3);  // the word price, not its pairs' 5 / 4
  EXPECT_EQ(est("x", cheap), 3);
}

TEST(EstimatorWords, TheLastWordIsAWordWhileAVocabularyWordStartsWithIt) {
  const auto p = with_words(params(4, kOne, kOne), ctxcore::kWordsCl100k, "hello\nworld");
  EXPECT_EQ(est("hel", p), 1);   // may still become "hello"
  EXPECT_EQ(est("hxl", p), 3);   // cannot
  EXPECT_EQ(est("hel.", p), 4);  // ended, and not a word
  EXPECT_EQ(est(std::string(200, 'h'), p), 200);
  // A word not found is at least two tokens.
  EXPECT_EQ(est("hx", p), 2);
  EXPECT_EQ(est("x.", p), 3);
}

TEST(EstimatorWords, TheMarginCoversWhatIsEstimatedOnly) {
  // scale 2, spread 0: a vocabulary word is priced at word_scale (1) x one token, every
  // other code point at 2 x its pair cost.
  auto p = with_words(params(4, kOne, kOne, 2.0, 0.0), ctxcore::kWordsCl100k, "hello\n world");
  EXPECT_EQ(est("hello", p), 1);             // a vocabulary word, open at the end
  EXPECT_EQ(est("hello world", p), 2);       // " world" takes its space along
  EXPECT_EQ(est("hello.\n", p), 1 + 2 + 2);  // "." and "\n" are estimated: 2 x 1 each
  // A character that a word could still take along ends the text: sure until something
  // other than a letter follows it.
  EXPECT_EQ(est("hello.", p), 1 + 1);
  EXPECT_EQ(est("hello ", p), 1 + 1);
  EXPECT_EQ(est("hx", p), 4);  // not a word: 2 x two tokens
  p.word_scale = 1.5;
  EXPECT_EQ(est("hello world", p), 3);  // ceil(1.5 x 2)
  p.word_scale = 2.5;                   // above scale: a growing text could drop
  EXPECT_THROW(ctxcore::validate(p), std::invalid_argument);
}

TEST(EstimatorWords, ACodePointThatIsNoTokenCostsAtLeastTwo) {
  const auto p = with_words(params(4, kOne, kOne), ctxcore::kWordsCl100k, "hello\n\xE4\xB8\xAD");
  EXPECT_EQ(est("\xE4\xB8\xAD", p), 1);      // 中 is a token
  EXPECT_EQ(est("\xE6\x96\x87", p), 2);      // 文 is not
  EXPECT_EQ(est("\xF0\xB0\x80\x80", p), 2);  // nor U+30000, past the class table
  EXPECT_EQ(est(".\xE6\x96\x87\xE4\xB8\xAD", p), 1 + 2 + 1);
}

TEST(EstimatorWords, DigitsCostOneTokenPerGroupOfThree) {
  const auto p = with_words(params(4, kOne / 8, kOne / 8), ctxcore::kWordsCl100k, "x\n\xE4\xB8\xAD");
  EXPECT_EQ(est("1", p), 1);
  EXPECT_EQ(est("123", p), 1);
  EXPECT_EQ(est("1234", p), 2);
  EXPECT_EQ(est(std::string(3000, '7'), p), 1000);
  EXPECT_EQ(est(std::string(301, '0'), p), 101);
  // A repeated code point that is a token costs at least one token each time it repeats.
  std::string rep;
  for (int i = 0; i < 10; ++i) rep += "\xE4\xB8\xAD";
  EXPECT_EQ(est(rep, p), 10);  // ceil(1 / 8 + 9)
}

TEST(EstimatorWords, RunsOfOneCharacterCostAtLeastATokenPerLongestRun) {
  const auto p = with_words(params(4, kOne / 16, kOne / 16), ctxcore::kWordsCl100k, "&&\n--------\nx\nqq");
  EXPECT_EQ(est(std::string(377, 'q') + ".", p), 189);  // ceil(1 / 16 + 376 / 2 + 1 / 16)
  EXPECT_EQ(est(std::string(395, '&'), p), 198);        // ceil(1 / 16 + 394 / 2)
  EXPECT_EQ(est(std::string(81, '-'), p), 11);          // ceil(1 / 16 + 80 / 8)
  EXPECT_EQ(est(std::string(100, '='), p), 7);          // no run of "=" is a token: the pair costs
  EXPECT_EQ(est(std::string(50, '\x01'), p), 50);       // a control character is its own token
  // Runs of newlines: the words may hold them (NUL separates words).
  auto nl = params(4, kOne / 16, kOne / 16);
  ctxcore::set_words(nl, ctxcore::kWordsCl100k, ascii_classes(), std::string("\n\n\n\n\0x", 6), kOne);
  EXPECT_EQ(est(std::string(401, '\n'), nl), 101);  // ceil(1 / 16 + 400 / 4)
}

TEST(EstimatorWords, CaseSplitsAndMarksFollowTheFamily) {
  const std::string words = "hello\nWorld\nhelloWorld\ne\xCC\x81t";
  const auto cl = with_words(params(4, kOne, kOne), ctxcore::kWordsCl100k, words);
  const auto o2 = with_words(params(4, kOne, kOne), ctxcore::kWordsO200k, words);
  EXPECT_EQ(est("helloWorld.", cl), 1 + 1);   // one word in cl100k_base
  EXPECT_EQ(est("helloWorld.", o2), 2 + 1);   // "hello", "World" in o200k_base
  EXPECT_EQ(est("HELLOworld.", o2), 10 + 1);  // upper then lower: one chunk, no such word
  EXPECT_EQ(est("e\xCC\x81t.", o2), 1 + 1);   // a mark is a letter in o200k_base
  // cl100k_base: "e", then the mark (not a token by itself: two) attached to "t".
  EXPECT_EQ(est("e\xCC\x81t.", cl), 2 + (2 + 1) + 1);
}

TEST(EstimatorWords, MonotoneUnderAppend) {
  std::mt19937 rng(11);
  auto base = params(8, 0, 0, 1.13, 1.7);
  random_costs(base, rng);
  const std::vector<std::string> pieces = {"a",
                                           "b",
                                           "he",
                                           "llo",
                                           "Z",
                                           " ",
                                           "  ",
                                           "\n",
                                           "7",
                                           ",",
                                           "(",
                                           "...",
                                           "\xC3\xA9",
                                           "\xE4\xB8\xAD",
                                           "\xF0\x9F\x98\x80",
                                           "\xCC\x81",
                                           "\t",
                                           "\xFF"};
  for (unsigned mode : {ctxcore::kWordsCl100k, ctxcore::kWordsO200k}) {
    for (std::uint32_t wc : {0u, 700u, 2000u}) {
      const auto p = with_words(base, mode, "hello\n hello\n(a\nab\nZa\na\n\xC3\xA9\xCC\x81\n,he", wc);
      for (int trial = 0; trial < 150; ++trial) {
        std::string s;
        std::int64_t last = 0;
        for (int step = 0; step < 40; ++step) {
          s += pieces[rng() % pieces.size()];
          const auto e = est(s, p);
          ASSERT_GE(e, last) << s;
          last = e;
        }
      }
    }
  }
}

// A text of code points in the narrowest of the widths 1, 2 and 4 that holds them all.
struct Narrowest {
  std::vector<std::uint8_t> u8;
  std::vector<std::uint16_t> u16;
  std::u32string u32;
  unsigned width = 1;
  ctxcore::CodePoints view() const {
    if (width == 1) return {u8.data(), u8.size(), 1};
    if (width == 2) return {u16.data(), u16.size(), 2};
    return {u32.data(), u32.size(), 4};
  }
};

Narrowest narrowest(const std::u32string& s) {
  Narrowest t;
  char32_t top = 0;
  for (const char32_t c : s) top = std::max(top, c);
  if (top < 256) {
    t.u8.assign(s.begin(), s.end());
  } else if (top < 0x10000) {
    t.u16.assign(s.begin(), s.end());
    t.width = 2;
  } else {
    t.u32 = s;
    t.width = 4;
  }
  return t;
}

TEST(EstimatorWords, TheScanPricesWholeTextsAsTheWalkDoes) {
  std::mt19937 rng(23);
  auto base = params(10, 0, 0, 1.13, 1.7);
  random_costs(base, rng);
  auto classes = ascii_classes();
  classes[0x100] = ctxcore::kClassUpper;  // Ā ā
  classes[0x101] = ctxcore::kClassLower;
  classes[0x4E2D] = ctxcore::kClassLetterOther;
  classes[0xC0] = ctxcore::kClassUpper;  // À
  const std::vector<std::u32string> pieces = {
      U"a", U"b", U"he", U"llo", U"Z", U"HTTP", U"Server", U" ", U"  ", U"\n", U"\r\n", U"7", U"12345", U",", U"(",
      U"...", U"\u00e9", U"\u00c0", U"\u0100", U"\u0101", U"\u4e2d", U"\u0301", U"\t", U"\u00ff", U"\x01", U"\x7f",
      U"&&&&", U"\U0001F600", U"\U00030001", U"\U00031000", U"\U000E0001", U"qqqqqqqq", U"\u3000", U"\u00a0",
      // NUL, lone surrogates, noncharacters, the last code point of every plane past the BMP.
      std::u32string(1, U'\0'), std::u32string(1, 0xD800), std::u32string(1, 0xDFFF), U"\uFFFE", U"\uFFFF",
      U"\U0001FFFF", U"\U0002FFFF", U"\U0003FFFF", U"\U000FFFFF", U"\U0010FFFF"};
  // Vocabulary words: some pieces, and words made of them (with a leading space or mark).
  const std::string words =
      "hello\n hello\n(a\nab\nZa\na\nHTTP\n Server\nServer\n\xC3\xA9\xCC\x81\n,he\n\xC4\x81\xC4\x81\n"
      " \xE4\xB8\xAD\nqqq\n&&\nllo\n b\nb";
  for (unsigned mode : {ctxcore::kWordsCl100k, ctxcore::kWordsO200k}) {
    for (std::uint32_t wc : {0u, 700u, 2000u, 40000u}) {
      auto p = base;
      std::string sep = words;
      for (char& c : sep)
        if (c == '\n') c = '\0';
      ctxcore::set_words(p, mode, classes, sep, wc);
      auto walked = p;
      ctxcore::validate(walked);
      ctxcore::prepare(p);
      // A word price past 32 tokens leaves the scan's tables empty: every text is walked.
      EXPECT_EQ(p.scan.pairs.empty(), wc > 32767);
      auto p_baseline = p;  // the scan's baseline loops, where the CPU has AVX2 too
      p_baseline.scan.avx2 = false;
      for (int trial = 0; trial < 300; ++trial) {
        std::u32string s;
        // Up to 3,000 code points, so that words and digit groups cross the scan's segments;
        // some texts are one long run of letters.
        const std::size_t target = rng() % 4 == 0 ? rng() % 3000 : rng() % 60;
        const bool one_run = rng() % 10 == 0;
        while (s.size() < target) s += one_run ? pieces[rng() % 7] : pieces[rng() % pieces.size()];
        const Narrowest t = narrowest(s);
        const ctxcore::RawCost fast = ctxcore::raw_cost(t.view(), p);
        const ctxcore::RawCost slow = ctxcore::raw_cost_walked(t.view(), walked);
        ASSERT_EQ(fast.units, slow.units) << mode << " " << wc << " " << s.size();
        ASSERT_EQ(fast.sure, slow.sure) << mode << " " << wc << " " << s.size();
        const ctxcore::RawCost baseline = ctxcore::raw_cost(t.view(), p_baseline);
        ASSERT_EQ(baseline.units, slow.units) << mode << " " << wc << " " << s.size();
        ASSERT_EQ(baseline.sure, slow.sure) << mode << " " << wc << " " << s.size();
        ASSERT_EQ(ctxcore::estimate_tokens(t.view(), p), ctxcore::estimate_tokens(t.view(), walked));
        // The same text as UCS-4 is priced the same as in its narrowest form.
        ASSERT_EQ(ctxcore::estimate_tokens(ctxcore::CodePoints{s.data(), s.size(), 4}, p),
                  ctxcore::estimate_tokens(t.view(), p));
      }
    }
  }
}

// A class for every code point, from a hash of it (about half of them letters, of every
// kind), ASCII as Unicode has it; with `odd_ascii`, "_" and "$" are letters and vertical tab
// is no space, so that the scan reads ASCII classes from its table instead of comparing.
std::vector<std::uint8_t> hashed_classes(bool odd_ascii) {
  std::vector<std::uint8_t> c(ctxcore::kClassLimit);
  for (std::size_t cp = 0; cp < c.size(); ++cp) {
    const unsigned r = ((static_cast<std::uint32_t>(cp) * 0x9E3779B1u) >> 24) % 16;
    c[cp] = r < 3    ? ctxcore::kClassLower
            : r < 6  ? ctxcore::kClassUpper
            : r < 9  ? ctxcore::kClassLetterOther
            : r < 10 ? ctxcore::kClassMark
            : r < 11 ? ctxcore::kClassNumber
            : r < 12 ? ctxcore::kClassSpace
                     : ctxcore::kClassOther;
  }
  for (char32_t cp = 0; cp < 0x80; ++cp) c[cp] = ctxcore::kClassOther;
  for (char32_t cp = 'a'; cp <= 'z'; ++cp) c[cp] = ctxcore::kClassLower;
  for (char32_t cp = 'A'; cp <= 'Z'; ++cp) c[cp] = ctxcore::kClassUpper;
  for (char32_t cp = '0'; cp <= '9'; ++cp) c[cp] = ctxcore::kClassNumber;
  c['\t'] = c['\v'] = c['\f'] = c[' '] = ctxcore::kClassSpace;
  c['\n'] = c['\r'] = ctxcore::kClassNewline;
  if (odd_ascii) {
    c['_'] = ctxcore::kClassLetterOther;
    c['$'] = ctxcore::kClassLower;
    c['\v'] = ctxcore::kClassOther;
  }
  return c;
}

// Runs of code points from one range at a time (ASCII, Latin-1, the rest of the BMP with its
// surrogates, the planes past it), so that blocks below 256 and past it follow each other.
std::u32string mixed_text(std::mt19937& rng, std::size_t size) {
  static const char32_t kRanges[][2] = {{0x20, 0x7F},     {'a', 'z' + 1},   {0x00, 0x100},  {0x100, 0x800},
                                        {0x3000, 0xA000}, {0xD800, 0xE000}, {0x0, 0x10000}, {0x10000, 0x110000}};
  std::u32string s;
  while (s.size() < size) {
    const auto& r = kRanges[rng() % 8];
    const std::size_t run = 1 + rng() % 40;
    for (std::size_t i = 0; i < run; ++i) s += static_cast<char32_t>(r[0] + rng() % (r[1] - r[0]));
    if (rng() % 3 == 0) s += U' ';
  }
  return s;
}

// The scan (both forms of its inner loops) and the walk give `text` the same raw cost, in its
// narrowest width and as UCS-4.
void expect_scan_is_walk(const std::u32string& text, const EstimatorParams& p, const std::string& what) {
  auto baseline = p;
  baseline.scan.avx2 = false;
  const Narrowest t = narrowest(text);
  for (const ctxcore::CodePoints view : {t.view(), ctxcore::CodePoints{text.data(), text.size(), 4}}) {
    const ctxcore::RawCost walked = ctxcore::raw_cost_walked(view, p);
    for (const EstimatorParams* q : std::initializer_list<const EstimatorParams*>{&p, &baseline}) {
      const ctxcore::RawCost scanned = ctxcore::raw_cost(view, *q);
      ASSERT_EQ(scanned.units, walked.units) << what << " width " << view.width << " size " << text.size();
      ASSERT_EQ(scanned.sure, walked.sure) << what << " width " << view.width << " size " << text.size();
    }
  }
}

TEST(EstimatorWords, TheScanPricesAnyCodePointsAsTheWalkDoes) {
  std::mt19937 rng(41);
  auto base = params(12, 0, 0, 1.13, 1.7);
  random_costs(base, rng);
  std::vector<std::u32string> texts;
  for (int i = 0; i < 120; ++i) texts.push_back(mixed_text(rng, rng() % 3 == 0 ? rng() % 4000 : rng() % 200));
  // Words longer than any vocabulary word and than a segment, of ASCII letters and of others.
  texts.push_back(std::u32string(5000, U'a') + U" " + std::u32string(3000, U'\u0101') + U"x");
  texts.push_back(U"(" + std::u32string(2100, U'\u4e2d'));
  for (const bool odd_ascii : {false, true}) {
    const auto classes = hashed_classes(odd_ascii);
    for (unsigned mode : {ctxcore::kWordsCl100k, ctxcore::kWordsO200k}) {
      // The vocabulary: every other word of the texts (those UTF-8 can carry), so that both
      // kinds of word occur, and single code points (tokens by themselves).
      auto first = base;
      ctxcore::set_words(first, mode, classes, "x", 1024);
      std::string vocabulary = "a";
      std::size_t k = 0;
      for (const auto& text : texts) {
        ctxcore::for_each_word(
            ctxcore::CodePoints{text.data(), text.size(), 4}, first, [&](std::size_t b, std::size_t e, bool) {
              const std::u32string word = text.substr(b, e - b);
              const bool carried = word.size() <= ctxcore::kMaxWordCodePoints &&
                                   std::none_of(word.begin(), word.end(),
                                                [](char32_t c) { return c == 0 || (c >= 0xD800 && c < 0xE000); });
              if (carried && k++ % 2 == 0) vocabulary += std::string(1, '\0') + utf8(word);
            });
      }
      for (char32_t c = 0x20; c < 0x3000; c += 7) vocabulary += std::string(1, '\0') + utf8(std::u32string(1, c));
      for (std::uint32_t wc : {700u, 1024u, 2000u}) {
        auto p = base;
        ctxcore::set_words(p, mode, classes, vocabulary, wc);
        ctxcore::prepare(p);
        EXPECT_EQ(p.scan.ascii_standard, !odd_ascii);
        for (const auto& text : texts) {
          expect_scan_is_walk(text, p, "mode " + std::to_string(mode) + " odd " + std::to_string(odd_ascii));
          // And every prefix of a short one: the last word open at every length.
          if (text.size() < 40) {
            for (std::size_t n = 1; n < text.size(); ++n) expect_scan_is_walk(text.substr(0, n), p, "prefix");
          }
        }
      }
    }
  }
}

TEST(EstimatorWords, VocabularyWordsAreFoundAndNoOthers) {
  // Words of letters from several scripts (ASCII, Latin-1, Latin Extended, Cyrillic, CJK,
  // and a plane past the BMP), each alone on its line: found exactly when in the vocabulary,
  // whatever the width the text is held in, by the walk and (same raw costs) by the scan.
  std::mt19937 rng(7);
  const std::u32string scripts[] = {U"abcdefghijklmnopqrstuvwxyz",     U"abcdefgh\u00e9\u00fc\u00df\u00e0",
                                    U"\u0101\u0103\u0105\u0107\u0109", U"\u0430\u0431\u0432\u0433\u0434\u0435",
                                    U"\u4e2d\u6587\u672c\u8a9e",       U"\U00020000\U00020001\U00020002"};
  auto classes = ascii_classes();
  for (const auto& script : scripts)
    for (const char32_t c : script)
      if (c < ctxcore::kClassLimit) classes[c] = ctxcore::kClassLower;
  const auto word = [&] {
    const auto& script = scripts[rng() % 6];
    std::u32string w;
    const std::size_t n = 1 + rng() % 20;
    for (std::size_t i = 0; i < n; ++i) w += script[rng() % script.size()];
    return w;
  };
  std::vector<std::u32string> vocabulary;
  std::string joined;
  for (int i = 0; i < 20000; ++i) {
    vocabulary.push_back(word());
    joined += (i ? std::string(1, '\0') : std::string()) + utf8(vocabulary.back());
  }
  std::sort(vocabulary.begin(), vocabulary.end());
  auto p = params(10, kOne / 3, kOne / 2, 1.1, 0.5);
  ctxcore::set_words(p, ctxcore::kWordsCl100k, classes, joined, kOne);
  ctxcore::prepare(p);
  std::size_t found = 0, wrong = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    // A line of a Cyrillic letter first (so that most texts are UCS-2 or wider), then words.
    std::u32string text = U"\u0430";
    std::vector<std::u32string> line;
    const std::size_t count = 1 + rng() % 12;
    for (std::size_t i = 0; i < count; ++i) {
      line.push_back(rng() % 2 ? vocabulary[rng() % vocabulary.size()] : word());
      text += U"\n" + line.back();
    }
    if (rng() % 4 == 0) text = text.substr(2);  // some texts all ASCII or Latin-1
    const Narrowest t = narrowest(text);
    for (const ctxcore::CodePoints view : {t.view(), ctxcore::CodePoints{text.data(), text.size(), 4}}) {
      ctxcore::for_each_word(view, p, [&](std::size_t b, std::size_t e, bool is_found) {
        const std::u32string w = text.substr(b, e - b);
        const bool in = std::binary_search(vocabulary.begin(), vocabulary.end(), w);
        found += is_found;
        wrong += is_found != in;
      });
    }
    expect_scan_is_walk(text, p, "lookups");
  }
  EXPECT_GT(found, 10000u);
  EXPECT_EQ(wrong, 0u);
}

TEST(EstimatorWords, PiecePricesBoundTheWholeText) {
  std::mt19937 rng(5);
  auto base = params(8, 0, 0, 1.2, 0.8);
  for (auto& c : base.latin_costs) c = static_cast<std::uint16_t>(rng() % 2000);
  for (auto& c : base.block_costs) c = static_cast<std::uint16_t>(rng() % 2000);
  const std::u32string alphabet = U"abhelo (.,\n\t7Z\u00E9\u0301\u4E2D";
  for (unsigned mode : {ctxcore::kWordsCl100k, ctxcore::kWordsO200k}) {
    const auto p = with_words(base, mode, "hello\n hello\n(a\nab\nZa\na\nb\n.b\nhe\n\u00E9", 300);
    for (int trial = 0; trial < 300; ++trial) {
      std::u32string text;
      const std::size_t n = 1 + rng() % 30;
      for (std::size_t i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
      std::vector<std::int64_t> ends;
      for (std::size_t i = 1; i < n; ++i)
        if (rng() % 3 == 0) ends.push_back(static_cast<std::int64_t>(i));
      ends.push_back(static_cast<std::int64_t>(n));
      const std::vector<std::uint8_t> any(ends.size(), 0);
      std::vector<std::int64_t> out(ends.size());
      ctxcore::price_pieces(ctxcore::CodePoints{text.data(), text.size(), 4}, {ends.data(), ends.size()},
                            {any.data(), any.size()}, U'>', U'>', p, out.data());
      std::int64_t sum = 0;
      for (const auto v : out) sum += v;
      ASSERT_GE(sum, est32(text, p)) << trial;
    }
  }
}

TEST(EstimatorWords, SetWordsRejectsBadInput) {
  auto p = params(4, 1, 1);
  EXPECT_THROW(ctxcore::set_words(p, 3, ascii_classes(), "a", kOne), std::invalid_argument);
  EXPECT_THROW(ctxcore::set_words(p, 1, std::vector<std::uint8_t>(10), "a", kOne), std::invalid_argument);
  auto bad = ascii_classes();
  bad[5] = 9;
  EXPECT_THROW(ctxcore::set_words(p, 1, bad, "a", kOne), std::invalid_argument);
  EXPECT_THROW(ctxcore::set_words(p, 1, ascii_classes(), std::string("a\0\0b", 4), kOne), std::invalid_argument);
  EXPECT_THROW(ctxcore::set_words(p, 1, ascii_classes(), std::string("a\0\xFF", 3), kOne), std::invalid_argument);
  EXPECT_THROW(ctxcore::set_words(p, 1, ascii_classes(), std::string(129, 'a'), kOne), std::invalid_argument);
  EXPECT_THROW(ctxcore::set_words(p, 1, ascii_classes(), "a", 65 * kOne), std::invalid_argument);
  EXPECT_NO_THROW(ctxcore::set_words(p, 0, {}, "", 0));
  EXPECT_NO_THROW(ctxcore::validate(p));
  p.words.mode = ctxcore::kWordsCl100k;  // a model not built by set_words
  EXPECT_THROW(ctxcore::validate(p), std::invalid_argument);
}

}  // namespace

// The coordinator contract of DESIGN.md / seed/squeeze_coordinator.txt and the properties of the
// budget splits, checked over thousands of random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {
namespace {

TEST(SqueezeCoordinator, NothingResolvedUntilEveryLayerReported) {
  SqueezeCoordinator c(4, 100, 4, 1.0);
  EXPECT_EQ(c.n_layers(), 4);
  EXPECT_EQ(c.avg_budget(), 100);
  EXPECT_DOUBLE_EQ(c.strength(), 1.0);
  c.report_concentration(0, 0.9);
  c.report_concentration(2, 0.1);
  c.report_concentration(2, 0.5);  // a repeat of layer 2 does not count as layer 3
  EXPECT_FALSE(c.is_finalized());
  for (int l = 0; l < 4; ++l) EXPECT_FALSE(c.resolved_budget(l).has_value());
  c.report_concentration(1, 0.5);
  EXPECT_FALSE(c.is_finalized());
  c.report_concentration(3, 0.5);
  ASSERT_TRUE(c.is_finalized());
  const double conc[] = {0.9, 0.5, 0.1, 0.5};  // layer 2's first report (0.1) won
  const auto want = squeeze_budgets(conc, 100, 4, 1.0);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(c.resolved_budget(l), want[l]);
  EXPECT_GT(*c.resolved_budget(2), *c.resolved_budget(0));
}

TEST(SqueezeCoordinator, FirstReportWinsAndScheduleStaysFrozen) {
  SqueezeCoordinator c(2, 64, 4, 1.0);
  c.report_concentration(0, 0.2);
  c.report_concentration(1, 0.8);
  ASSERT_TRUE(c.is_finalized());
  const int b0 = *c.resolved_budget(0), b1 = *c.resolved_budget(1);
  c.report_concentration(0, 0.99);  // decode-step reports are ignored
  c.report_concentration(1, 0.0);
  EXPECT_EQ(*c.resolved_budget(0), b0);
  EXPECT_EQ(*c.resolved_budget(1), b1);
  EXPECT_DOUBLE_EQ(*c.concentration(0), 0.2);
}

TEST(SqueezeCoordinator, ResetClearsReportedAndResolved) {
  SqueezeCoordinator c(2, 64, 4, 1.0);
  c.report_concentration(0, 0.2);
  c.report_concentration(1, 0.8);
  ASSERT_TRUE(c.is_finalized());
  c.reset();
  EXPECT_FALSE(c.is_finalized());
  EXPECT_FALSE(c.resolved_budget(0).has_value());
  EXPECT_FALSE(c.concentration(0).has_value());
  c.report_concentration(0, 0.8);  // reports count again after a reset
  c.report_concentration(1, 0.2);
  ASSERT_TRUE(c.is_finalized());
  EXPECT_LT(*c.resolved_budget(0), *c.resolved_budget(1));
}

TEST(SqueezeCoordinator, BadArgumentsThrowNamingTheArgument) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_THROW(SqueezeCoordinator(0, 10, 2, 0.5), std::invalid_argument);
  EXPECT_NE(msg([] { SqueezeCoordinator(0, 10, 2, 0.5); }).find("n_layers"), std::string::npos);
  EXPECT_THROW(SqueezeCoordinator(2, 4, 4, 0.5), std::invalid_argument);
  EXPECT_NE(msg([] { SqueezeCoordinator(2, 4, 4, 0.5); }).find("avg_budget"), std::string::npos);
  EXPECT_THROW(SqueezeCoordinator(2, 10, 2, 1.5), std::invalid_argument);
  EXPECT_THROW(SqueezeCoordinator(2, 10, 2, -0.1), std::invalid_argument);
  EXPECT_NE(msg([] { SqueezeCoordinator(2, 10, 2, -0.1); }).find("strength"), std::string::npos);
  SqueezeCoordinator c(3, 10, 2, 0.5);
  EXPECT_THROW(c.report_concentration(3, 0.1), std::out_of_range);
  EXPECT_THROW(c.report_concentration(-1, 0.1), std::out_of_range);
  EXPECT_NE(msg([&] { c.report_concentration(7, 0.1); }).find("layer_id"), std::string::npos);
  EXPECT_THROW(c.resolved_budget(3), std::out_of_range);
  EXPECT_THROW(c.report_concentration(0, std::nan("")), std::invalid_argument);
  EXPECT_THROW(c.report_concentration(0, INFINITY), std::invalid_argument);
  EXPECT_NE(msg([&] { c.report_concentration(1, INFINITY); }).find("concentration"), std::string::npos);
  const double bad[] = {0.1, NAN};
  EXPECT_THROW(squeeze_budgets(bad, 10, 2, 0.5), std::invalid_argument);
}

TEST(SqueezeBudgets, Examples) {
  const double c[] = {0.0, 0.5, 1.0};
  // weights 1, .5, 0 -> scaled 2, 1, 0 -> targets 200, 100, 0 -> floor 5 taken from the largest
  EXPECT_EQ(squeeze_budgets(c, 100, 4, 1.0), (std::vector<int>{195, 100, 5}));
  EXPECT_EQ(squeeze_budgets(c, 100, 4, 0.0), (std::vector<int>{100, 100, 100}));
  const double same[] = {1.0, 1.0};  // all weights zero: uniform
  EXPECT_EQ(squeeze_budgets(same, 50, 4, 1.0), (std::vector<int>{50, 50}));
  const double one[] = {0.7};
  EXPECT_EQ(squeeze_budgets(one, 5, 4, 1.0), (std::vector<int>{5}));
}

// Property test over thousands of random inputs: exact total, floors, strength 0 uniform,
// monotone in concentration, one layer gets max(avg, n_sink + 1).
TEST(SqueezeBudgets, PropertiesOverRandomInputs) {
  std::mt19937_64 rng(2024);
  for (int it = 0; it < 5000; ++it) {
    const int n = std::uniform_int_distribution<int>(1, 64)(rng);
    const int sink = std::uniform_int_distribution<int>(0, 16)(rng);
    const int avg = sink + 1 + std::uniform_int_distribution<int>(0, it % 3 == 0 ? 3 : 2000)(rng);
    const double s = it % 7 == 0 ? 0.0 : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    std::vector<double> c(n);
    for (auto& x : c) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      x = kind == 0 ? -0.5 : kind == 1 ? 1.5 : kind == 2 ? 0.5 : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    }
    const auto b = squeeze_budgets(c, avg, sink, s);
    ASSERT_EQ(static_cast<int>(b.size()), n);
    ASSERT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}), int64_t{n} * avg) << "it=" << it;
    for (int i = 0; i < n; ++i) ASSERT_GE(b[i], sink + 1) << "it=" << it;
    if (s == 0.0) {
      for (int x : b) ASSERT_EQ(x, avg);
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (std::clamp(c[i], 0.0, 1.0) < std::clamp(c[j], 0.0, 1.0)) {
          ASSERT_GE(b[i], b[j]) << "it=" << it << " lower concentration got a smaller budget";
        }
    if (n == 1) {
      ASSERT_EQ(b[0], std::max(avg, sink + 1));
    }
  }
}

TEST(Kmeans3Budgets, HighestClusterGetsPTimesAvgAndTotalHolds) {
  const double s[] = {0.1, 0.12, 0.5, 0.52, 0.9, 0.91, 0.92};
  const auto b = kmeans3_budgets(s, 100, 4, 0.5);
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 700);
  EXPECT_EQ(b[4], 50);
  EXPECT_EQ(b[5], 50);
  EXPECT_EQ(b[6], 50);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b[i], 550 / 4 + (i < 550 % 4 ? 1 : 0));
  const double two[] = {0.1, 0.1, 0.9};  // fewer than 3 distinct scores: uniform
  EXPECT_EQ(kmeans3_budgets(two, 100, 4, 0.5), (std::vector<int>{100, 100, 100}));
  std::mt19937_64 rng(7);
  for (int it = 0; it < 2000; ++it) {
    const int n = std::uniform_int_distribution<int>(3, 48)(rng);
    const int avg = std::uniform_int_distribution<int>(6, 3000)(rng);
    std::vector<double> sc(n);
    for (auto& x : sc) x = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const auto bb = kmeans3_budgets(sc, avg, 4, 0.3);
    ASSERT_EQ(std::accumulate(bb.begin(), bb.end(), int64_t{0}), int64_t{n} * avg);
    for (int x : bb) ASSERT_GE(x, 5);
  }
}

// The cap (--squeeze-cap): water-filling keeps the total, respects the cap, and hands the excess
// in proportion to the budgets that were below it.
TEST(WaterFill, CapsHandTheExcessOnAndKeepTheTotal) {
  const std::vector<int> b = {300, 50, 25, 25};  // total 400, cap 120
  const std::vector<int> w = water_fill_budgets(b, 120);
  EXPECT_EQ(std::accumulate(w.begin(), w.end(), 0), 400);
  EXPECT_EQ(w[0], 120);
  // the 180 over the cap goes 2:1:1 to the others: 50 + 90 = 140 > 120, so layer 1 caps too and
  // its extra 20 goes 1:1 to layers 2 and 3
  EXPECT_EQ(w[1], 120);
  EXPECT_EQ(w[2], 80);
  EXPECT_EQ(w[3], 80);
  // nothing over the cap: unchanged
  EXPECT_EQ(water_fill_budgets(b, 300), b);
  // every layer could hold all it sees: unchanged (the headroom serves decode)
  EXPECT_EQ(water_fill_budgets(b, 100), b);
  EXPECT_THROW(water_fill_budgets(b, 0), std::invalid_argument);
  // random schedules: exact total, nothing over the cap, order kept among the free layers
  std::mt19937 rng(4);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<int> r(n);
    for (int& x : r) x = 5 + static_cast<int>(rng() % 3000);
    const int total = std::accumulate(r.begin(), r.end(), 0);
    const int cap = 1 + static_cast<int>(rng() % 4000);
    const std::vector<int> f = water_fill_budgets(r, cap);
    ASSERT_EQ(std::accumulate(f.begin(), f.end(), 0), total);
    if (static_cast<int64_t>(n) * cap <= total) {
      EXPECT_EQ(f, r);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_LE(f[i], cap);
      ASSERT_GE(f[i], std::min(r[i], cap));  // nobody loses unless over the cap
      for (int j = 0; j < n; ++j)
        if (r[i] < r[j]) {
          ASSERT_LE(f[i], f[j] + 1) << "order";  // +1: a remainder unit
        }
    }
  }
}

TEST(SqueezeCoordinator, TokenCapAppliesAtFinalisation) {
  SqueezeCoordinator c(4, 100, 4, 1.0);
  c.set_token_cap(150);
  c.report_concentration(0, 0.0);
  c.report_concentration(1, 0.95);
  c.report_concentration(2, 0.95);
  c.report_concentration(3, 0.95);
  int total = 0;
  for (int l = 0; l < 4; ++l) {
    EXPECT_LE(*c.resolved_budget(l), 150);
    total += *c.resolved_budget(l);
  }
  EXPECT_EQ(total, 400);
  EXPECT_EQ(*c.resolved_budget(0), 150);
  c.reset();  // the cap goes with the reset
  c.report_concentration(0, 0.0);
  c.report_concentration(1, 0.95);
  c.report_concentration(2, 0.95);
  c.report_concentration(3, 0.95);
  EXPECT_GT(*c.resolved_budget(0), 150);
}

}  // namespace
}  // namespace squeezekv

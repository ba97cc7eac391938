// The row loops against float64 arithmetic on the same float inputs, on rows whose mean is far
// from 0 next to their spread (where a mean rounded to float would cost x̂ its precision), rows
// whose first values are far from the rest (the one-pass moments' worst shift) and constant rows.
#include "meshflow/kernels/layer_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow {
namespace {

constexpr float kEps = 1e-5f;

struct Rows {
  std::string kind;
  std::int64_t d = 0;
  std::vector<float> x;
};

// Five rows of width d of one kind.
Rows rows_of(const std::string& kind, std::int64_t d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> unit(0, 1);
  Rows r{kind, d, {}};
  for (int row = 0; row < 5; ++row) {
    for (std::int64_t j = 0; j < d; ++j) {
      float v = unit(rng);
      if (kind == "mean 1e4") v = 1e4f + v;
      if (kind == "mean -300, spread 0.01") v = -300.0f + 0.01f * v;
      if (kind == "first 64 far") v = (j < 64 ? 50.0f : -50.0f) + v;
      if (kind == "constant") v = 2.5f;
      r.x.push_back(v);
    }
  }
  return r;
}

// The values and, for each, the largest magnitude of the terms that make them (float's precision
// is relative to those: gx of a row of width 1 is 0 made of rstd g w - rstd g w).
struct Reference {
  std::vector<double> y, gx, gw;
  std::vector<double> mean, rstd, spread;  // per row; spread: the largest |x - mean|
  double y_terms = 0, gx_terms = 0, gw_terms = 0;
};

// Layer norm and its gradients in float64 from the float inputs, two-pass statistics.
Reference reference(const std::vector<float>& x, const std::vector<float>& g,
                    const std::vector<float>& w, const std::vector<float>& b, std::int64_t d) {
  const auto rows = static_cast<std::int64_t>(x.size()) / d;
  Reference out{.gw = std::vector<double>(static_cast<std::size_t>(d), 0.0)};
  std::vector<double> gw_terms(out.gw.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto at = [&](const std::vector<float>& v, std::int64_t j) {
      return double{v[static_cast<std::size_t>(r * d + j)]};
    };
    double mean = 0, var = 0, m1 = 0, m2 = 0;
    for (std::int64_t j = 0; j < d; ++j) mean += at(x, j);
    mean /= static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j) var += (at(x, j) - mean) * (at(x, j) - mean);
    const double rstd = 1 / std::sqrt(var / static_cast<double>(d) + double{kEps});
    double spread = 0;
    for (std::int64_t j = 0; j < d; ++j) spread = std::max(spread, std::abs(at(x, j) - mean));
    out.mean.push_back(mean);
    out.rstd.push_back(rstd);
    out.spread.push_back(spread);
    std::vector<double> xhat;
    for (std::int64_t j = 0; j < d; ++j) xhat.push_back((at(x, j) - mean) * rstd);
    for (std::int64_t j = 0; j < d; ++j) {
      const auto k = static_cast<std::size_t>(j);
      out.y.push_back(xhat[k] * w[k] + b[k]);
      m1 += at(g, j) * w[k] / static_cast<double>(d);
      m2 += at(g, j) * w[k] * xhat[k] / static_cast<double>(d);
      out.gw[k] += at(g, j) * xhat[k];
      gw_terms[k] += std::abs(at(g, j) * xhat[k]);
      out.y_terms = std::max(out.y_terms, std::abs(xhat[k] * w[k]) + std::abs(b[k]));
      out.gx_terms = std::max(out.gx_terms, rstd * std::abs(at(g, j) * w[k]));
    }
    for (std::int64_t j = 0; j < d; ++j) {
      const auto k = static_cast<std::size_t>(j);
      out.gx.push_back(rstd * (at(g, j) * w[k] - m1 - xhat[k] * m2));
    }
  }
  for (double t : gw_terms) out.gw_terms = std::max(out.gw_terms, t);
  return out;
}

// Every value within tol times the largest term.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double terms,
                  double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = terms;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * scale + 1e-30) << what << " at " << i;
  }
}

TEST(LayerNormRows, ForwardAndBothGradientsAsFloat64WhateverTheRowsMean) {
  for (const std::string kind :
       {"centred", "mean 1e4", "mean -300, spread 0.01", "first 64 far", "constant"}) {
    for (std::int64_t d : {1, 7, 64, 100, 512, 1000}) {
      const Rows r = rows_of(kind, d, static_cast<unsigned>(d) + 7);
      std::mt19937 rng(static_cast<unsigned>(d) + 11);
      std::normal_distribution<float> unit(0, 1);
      std::vector<float> g(r.x.size()), w(static_cast<std::size_t>(d)), b(w.size());
      for (float& v : g) v = unit(rng);
      for (float& v : w) v = 1 + 0.5f * unit(rng);
      for (float& v : b) v = unit(rng);
      const Reference want = reference(r.x, g, w, b, d);
      const auto rows = static_cast<std::int64_t>(r.x.size()) / d;
      std::vector<float> y(r.x.size()), gx(r.x.size()), gw(w.size());
      std::vector<float> stats(static_cast<std::size_t>(rows * kNormStatsFloats));
      std::vector<float> stats_alone(stats.size());
      layer_norm_rows(r.x.data(), w.data(), b.data(), y.data(), stats.data(), rows, d, kEps);
      layer_norm_stats_rows(r.x.data(), stats_alone.data(), rows, d, kEps);
      layer_norm_grad_x_rows(g.data(), r.x.data(), w.data(), stats.data(), gx.data(), rows, d);
      layer_norm_grad_w_rows(g.data(), r.x.data(), stats.data(), gw.data(), rows, d);
      const std::string what = kind + ", d=" + std::to_string(d);
      EXPECT_EQ(stats_alone, stats) << what;
      // The mean is shift - bias / scale, 1 / scale the standard deviation (with eps).
      for (std::int64_t row = 0; row < rows; ++row) {
        const float* s = stats.data() + row * kNormStatsFloats;
        EXPECT_NEAR(s[0] - s[2] / s[1], want.mean[static_cast<std::size_t>(row)],
                    1e-6 * want.spread[static_cast<std::size_t>(row)] +
                        1e-6 * std::abs(want.mean[static_cast<std::size_t>(row)]))
            << what << " row " << row;
        EXPECT_NEAR(s[1], want.rstd[static_cast<std::size_t>(row)],
                    1e-5 * want.rstd[static_cast<std::size_t>(row)])
            << what << " row " << row;
      }
      // var within (1 + 2d / k) ε (layer_norm.cc; its shift is the mean of the first k = 64),
      // so rstd within half that, and x̂ and y a few roundings more: 2.3e-6 at d = 1000.
      const double y_tol = std::max(2e-6, (0.5 * (1 + 2.0 * static_cast<double>(d) / 64) + 3) *
                                              std::numeric_limits<float>::epsilon());
      expect_close(y, want.y, want.y_terms, y_tol, "y, " + what);
      expect_close(gx, want.gx, want.gx_terms, 1e-5, "gx, " + what);
      expect_close(gw, want.gw, want.gw_terms, 1e-5, "gw, " + what);
    }
  }
}

// Split over a team, each part's first row starts a new chain of fused forward passes (its
// moments alone, then each output pass with the next row's): the same bits as one thread and as
// the statistics alone, and the bias's gradient as sum_rows adds it.
TEST(LayerNormRows, ATeamGivesOneThreadsBits) {
  const std::int64_t rows = 1001, d = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> unit(0, 1);
  std::vector<float> x(static_cast<std::size_t>(rows * d)), g(x.size());
  std::vector<float> w(static_cast<std::size_t>(d)), b(w.size());
  for (float& v : x) v = 3 + unit(rng);
  for (float& v : g) v = unit(rng);
  for (float& v : w) v = 1 + 0.5f * unit(rng);
  for (float& v : b) v = unit(rng);
  struct Out {
    std::vector<float> y, stats, stats_alone, gx, gw, gw_alone, gb, gb_sum_rows;
  };
  const auto run = [&] {
    const auto floats = [](std::int64_t n) {
      return std::vector<float>(static_cast<std::size_t>(n));
    };
    Out o{floats(rows * d),
          floats(rows * kNormStatsFloats),
          floats(rows * kNormStatsFloats),
          floats(rows * d),
          floats(d),
          floats(d),
          floats(d),
          floats(d)};
    layer_norm_rows(x.data(), w.data(), b.data(), o.y.data(), o.stats.data(), rows, d, kEps);
    layer_norm_stats_rows(x.data(), o.stats_alone.data(), rows, d, kEps);
    layer_norm_grad_x_rows(g.data(), x.data(), w.data(), o.stats.data(), o.gx.data(), rows, d);
    layer_norm_grad_wb_rows(g.data(), x.data(), o.stats.data(), o.gw.data(), o.gb.data(), rows, d);
    layer_norm_grad_w_rows(g.data(), x.data(), o.stats.data(), o.gw_alone.data(), rows, d);
    sum_rows(g.data(), rows, d, o.gb_sum_rows.data());
    return o;
  };
  const Out alone = run();
  ThreadTeam team(3);
  const UseTeam use(&team);
  const Out split = run();
  EXPECT_EQ(split.y, alone.y);
  EXPECT_EQ(split.stats, alone.stats);
  EXPECT_EQ(split.stats_alone, alone.stats);
  EXPECT_EQ(split.gx, alone.gx);
  EXPECT_EQ(split.gw, alone.gw);
  EXPECT_EQ(split.gw_alone, alone.gw);
  EXPECT_EQ(split.gb, alone.gb);
  EXPECT_EQ(split.gb, split.gb_sum_rows);
  // And the rows' values, within float's error (the test above for their precision).
  const Reference want = reference(x, g, w, b, d);
  expect_close(split.y, want.y, want.y_terms, 2e-6, "y on a team");
  expect_close(split.gw, want.gw, want.gw_terms, 1e-5, "gw on a team");
}

}  // namespace
}  // namespace meshflow

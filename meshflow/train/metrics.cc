// metrics.jsonl and the loss plot.
#include "meshflow/train/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

// The plot's geometry in SVG user units.
struct Frame {
  double width = 800, height = 480, left = 80, right = 30, top = 50, bottom = 60;
  double plot_w() const { return width - left - right; }
  double plot_h() const { return height - top - bottom; }
};

// Returns "nice" tick values covering [lo, hi] (about `count` of them).
std::vector<double> ticks(double lo, double hi, int count) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

std::string label(double v) { return fmt::format("{:.4g}", v); }

}  // namespace

std::string loss_svg(const LossCurve& train, const LossCurve& val) {
  const Frame f;
  double lo = INFINITY, hi = -INFINITY;
  int first = 1, last = 1;
  bool any = false;
  for (const LossCurve* c : {&train, &val}) {
    for (const auto& [step, loss] : *c) {
      if (!std::isfinite(loss)) continue;
      lo = std::min(lo, loss);
      hi = std::max(hi, loss);
      first = any ? std::min(first, step) : step;
      last = any ? std::max(last, step) : step;
      any = true;
    }
  }
  if (!any) {
    lo = 0;
    hi = 1;
  }
  const bool log_y = lo > 0 && hi / lo >= 10;
  auto ty = [&](double v) { return log_y ? std::log10(v) : v; };
  double y0 = ty(lo), y1 = ty(hi);
  if (y1 - y0 < 1e-12) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  if (last == first) last = first + 1;
  auto px = [&](double step) { return f.left + (step - first) / (last - first) * f.plot_w(); };
  auto py = [&](double v) { return f.top + (y1 - ty(v)) / (y1 - y0) * f.plot_h(); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"13\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">Loss against "
      "step{3}</text>\n",
      f.width, f.height, f.width / 2, log_y ? " (log scale)" : "");
  // Grid, ticks and labels.
  for (double v : ticks(first, last, 8)) {
    const double x = px(v);
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x, f.top, f.top + f.plot_h(), f.top + f.plot_h() + 18, label(v));
  }
  std::vector<double> yt;
  if (log_y) {
    for (int e = static_cast<int>(std::floor(y0)); e <= static_cast<int>(std::ceil(y1)); ++e)
      for (double m : {1.0, 2.0, 3.0, 5.0}) {
        const double v = m * std::pow(10.0, e);
        if (std::log10(v) >= y0 && std::log10(v) <= y1) yt.push_back(v);
      }
  } else {
    yt = ticks(y0, y1, 6);
  }
  for (double v : yt) {
    const double y = py(v);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e4e4e4\"/>\n"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        f.left, y, f.left + f.plot_w(), f.left - 8, y + 4, label(v));
  }
  s += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n"
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n"
      "<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">loss "
      "(nats)</text>\n",
      f.left, f.top, f.plot_w(), f.plot_h(), f.left + f.plot_w() / 2, f.height - 14,
      f.top + f.plot_h() / 2, f.top + f.plot_h() / 2);
  auto curve = [&](const LossCurve& c, const char* color, const char* id, bool dots) {
    std::string points;
    for (const auto& [step, loss] : c) {
      if (!std::isfinite(loss) || (log_y && loss <= 0)) continue;
      points += fmt::format("{:.1f},{:.1f} ", px(step), py(loss));
      if (dots)
        s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(step),
                         py(loss), color);
    }
    s += fmt::format(
        "<polyline id=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        id, color, points);
  };
  curve(train, "#1f77b4", "train", false);
  curve(val, "#d62728", "val", true);
  const double lx = f.left + f.plot_w() - 150, ly = f.top + 12;
  s += fmt::format(
      "<rect x=\"{0}\" y=\"{1}\" width=\"140\" height=\"46\" fill=\"white\" stroke=\"#999\"/>\n"
      "<line x1=\"{2}\" y1=\"{3}\" x2=\"{4}\" y2=\"{3}\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n"
      "<text x=\"{5}\" y=\"{6}\">train loss</text>\n"
      "<line x1=\"{2}\" y1=\"{7}\" x2=\"{4}\" y2=\"{7}\" stroke=\"#d62728\" stroke-width=\"2\"/>\n"
      "<text x=\"{5}\" y=\"{8}\">val loss</text>\n",
      lx, ly, lx + 10, ly + 15, lx + 35, lx + 42, ly + 19, ly + 33, ly + 37);
  s += "</svg>\n";
  return s;
}

MetricsLog::MetricsLog(fs::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail(ErrorKind::kIo, "--log-dir {}: cannot create it: {}", dir_.string(), ec.message());
  const fs::path file = dir_ / "metrics.jsonl";
  if (fs::exists(file)) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      record(j);
    }
  }
  out_.open(file, std::ios::app);
  if (!out_) fail(ErrorKind::kIo, "--log-dir {}: cannot open metrics.jsonl", dir_.string());
}

void MetricsLog::append(const nlohmann::json& line) {
  out_ << line.dump() << '\n';
  out_.flush();
  record(line);
}

void MetricsLog::record(const nlohmann::json& line) {
  const int step = line.at("step").get<int>();
  auto number = [](const nlohmann::json& v) { return v.is_number() ? v.get<double>() : NAN; };
  if (line.contains("loss")) train_.emplace_back(step, number(line["loss"]));
  if (line.contains("val_loss")) val_.emplace_back(step, number(line["val_loss"]));
}

void MetricsLog::write_plot() const {
  write_file_atomic(dir_ / "loss.svg", loss_svg(train_, val_));
}

}  // namespace meshflow

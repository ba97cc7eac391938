// What a user watches during a run (`train --log-dir DIR`): DIR/metrics.jsonl gains one JSON
// object per step and per evaluation as they happen (a resumed run appends), and DIR/loss.svg,
// train and val loss against the step, is rewritten after each evaluation and at the end.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace meshflow {

// A curve of (step, loss) points.
using LossCurve = std::vector<std::pair<int, double>>;

// Returns an SVG plot of `train` and `val` against the step: axes with ticks, a legend, the y
// axis log-scaled where the finite losses span a decade or more.
std::string loss_svg(const LossCurve& train, const LossCurve& val);

// Appends to DIR/metrics.jsonl and rewrites DIR/loss.svg; owns the open file.
class MetricsLog {
 public:
  // Creates `dir` when missing and reads the lines an earlier run left (their losses stay on the
  // plot); throws Error(kIo) naming the path.
  explicit MetricsLog(std::filesystem::path dir);
  // Appends `line` (an object with "step" and "loss" or "val_loss") and flushes it.
  void append(const nlohmann::json& line);
  // Rewrites loss.svg from every line so far.
  void write_plot() const;

 private:
  // Adds `line`'s loss or val loss (null: not finite) to the plot's curves.
  void record(const nlohmann::json& line);
  std::filesystem::path dir_;
  std::ofstream out_;
  LossCurve train_, val_;
};

}  // namespace meshflow

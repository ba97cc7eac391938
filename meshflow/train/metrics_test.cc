#include "meshflow/train/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace meshflow {
namespace {

namespace fs = std::filesystem;

std::string points_of(const std::string& svg, const std::string& id) {
  const auto at = svg.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const auto from = svg.find("points=\"", at) + 8;
  return svg.substr(from, svg.find('"', from) - from);
}

TEST(LossSvg, LogScaleOnlyWhereTheLossSpansADecade) {
  const std::string wide = loss_svg({{1, 10.0}, {2, 3.0}, {3, 0.5}}, {{3, 0.7}});
  EXPECT_NE(wide.find("(log scale)"), std::string::npos);
  const std::string narrow = loss_svg({{1, 4.0}, {2, 3.0}}, {{2, 3.5}});
  EXPECT_EQ(narrow.find("(log scale)"), std::string::npos);
  EXPECT_EQ(narrow.rfind("<svg", 0), 0u);
  // Three train points and one val point; a point's y falls as its loss does.
  const std::string train = points_of(wide, "train");
  EXPECT_EQ(std::count(train.begin(), train.end(), ','), 3);
  EXPECT_EQ(std::count(wide.begin(), wide.end(), '\n') > 10, true);
}

TEST(LossSvg, NonFiniteLossesAreLeftOut) {
  const std::string svg = loss_svg({{1, 2.0}, {2, NAN}, {3, 1.5}}, {});
  const std::string train = points_of(svg, "train");
  EXPECT_EQ(std::count(train.begin(), train.end(), ','), 2);
  EXPECT_EQ(points_of(svg, "val"), "");
}

TEST(MetricsLog, AResumedRunAppendsAndPlotsTheEarlierLines) {
  const fs::path dir =
      fs::temp_directory_path() / ("meshflow_metrics_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    MetricsLog log(dir);
    log.append({{"step", 1}, {"loss", 3.0}});
    log.append({{"step", 1}, {"val_loss", 3.2}});
    log.write_plot();
  }
  {
    MetricsLog log(dir);  // a resumed run
    log.append({{"step", 2}, {"loss", 2.5}});
    log.write_plot();
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, 3);
  std::ifstream svg_in(dir / "loss.svg");
  const std::string svg((std::istreambuf_iterator<char>(svg_in)), {});
  const std::string train = points_of(svg, "train");
  EXPECT_EQ(std::count(train.begin(), train.end(), ','), 2);
  const std::string val = points_of(svg, "val");
  EXPECT_EQ(std::count(val.begin(), val.end(), ','), 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshflow

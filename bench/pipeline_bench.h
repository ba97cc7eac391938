// `meshflow bench pipeline`: two equal stages of an MLP, one device each on threads with one
// thread per device, trained under every schedule and micro-batch count (M = 1, 2, 4, 8; zb
// from 2). Each case reports the measured `bubble` (median over the steps) beside
// `bubble_theory` ((p-1)/(M+p-1), zb (p-1)/(3M+p-1)), the step's median seconds, `vs_ideal`
// (the step over the same model on one device at the same M and threads, divided by p and
// multiplied by (M+p-1)/M, both measured in this run: the baseline "ideal") and each stage's
// `peak_activation_bytes`.
#pragma once

#include "bench/report.h"

namespace meshflow::bench {

struct PipelineBenchOptions {
  bool progress = true;
  int reps = 5;               // timed steps per case (after one untimed)
  std::int64_t width = 1024;  // the layers' width (two layers per stage)
  std::int64_t batch = 256;
};

BenchReport run_pipeline_bench(const PipelineBenchOptions& options);

}  // namespace meshflow::bench

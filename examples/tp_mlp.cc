// A tensor-parallel MLP forward with DTensors on a 2x2 mesh ("dp" x "tp"): the batch is split
// over dp; the first linear is column-parallel (w1 split by output columns over tp), the second
// row-parallel (w2 split by input rows over tp), so the hidden activations never move and the
// output needs exactly one reduction. Prints the largest difference to the same MLP on one device.
#include <cstdio>

#include "meshflow/comm/launch.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/dtensor/dtensor.h"

int main() {
  using namespace meshflow;
  const std::int64_t batch = 64, in = 256, hidden = 1024, out = 256;
  const Tensor x = random_tensor(DType::kFloat32, {batch, in}, 1);
  const Tensor w1 = random_tensor(DType::kFloat32, {in, hidden}, 2);
  const Tensor b1 = random_tensor(DType::kFloat32, {hidden}, 3);
  const Tensor w2 = random_tensor(DType::kFloat32, {hidden, out}, 4);
  const Tensor b2 = random_tensor(DType::kFloat32, {out}, 5);

  // One device: y = gelu(x @ w1 + b1) @ w2 + b2.
  const Tensor h = compute({.type = OpType::kLinear}, {&x, &w1, &b1});
  const Tensor a = compute({.type = OpType::kGelu}, {&h});
  const Tensor want = compute({.type = OpType::kLinear}, {&a, &w2, &b2});

  const DeviceMesh mesh = make_mesh({2, 2}, {0, 1, 2, 3}, {"dp", "tp"});
  double max_diff = 0;
  std::string placements;
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    auto place = [&](const Tensor& t, const char* p) {
      return distribute_tensor(comm, t, mesh, parse_placements(p));
    };
    const DTensor dx = place(x, "S(0),R"), dw1 = place(w1, "R,S(1)"), db1 = place(b1, "R,S(0)");
    const DTensor dw2 = place(w2, "R,S(0)"), db2 = place(b2, "R,R");
    const DTensor dh = gelu(linear(dx, dw1, db1));  // S(0),S(1): no communication
    const DTensor dy = linear(dh, dw2, db2);        // S(0),P(sum): still none
    const Tensor got = full_tensor(dy);             // the one reduction (and the dp gather)
    if (comm.device() == 0) {
      placements = to_string(dh.layout.placements) + " then " + to_string(dy.layout.placements);
      max_diff = max_abs_difference(got, want);
    }
  });
  std::printf("tensor-parallel MLP %lldx%lld -> %lld -> %lld on mesh 2x2 (dp, tp): hidden %s\n",
              static_cast<long long>(batch), static_cast<long long>(in),
              static_cast<long long>(hidden), static_cast<long long>(out), placements.c_str());
  std::printf("max |difference| to one device: %.3g\n", max_diff);
  return max_diff < 1e-3 ? 0 : 1;
}

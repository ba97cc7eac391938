// The models graph/ and runtime/ tests share.
#include "meshflow/graph/testing.h"

#include <fmt/format.h>

namespace meshflow::testing {

Pcg dp_tp_mlp(const std::filesystem::path& labels, std::int64_t batch, std::int64_t in,
              std::int64_t hidden, std::int64_t classes) {
  Pcg g;
  const DeviceMesh m = parse_mesh("2x2");
  auto P = parse_placements;
  const ValueId x = add_input(g, "x", {{batch, in}}, m, P("S(0),R"), Source::normal(1, 11));
  const ValueId y = add_input(g, "y", {{batch}, DType::kInt64}, m, P("S(0),R"),
                              Source{.kind = Source::Kind::kNpy, .path = labels});
  const ValueId w1 = add_weight(g, "w1", {{in, hidden}}, m, P("R,S(1)"), Source::normal(0.3, 1));
  const ValueId w2 =
      add_weight(g, "w2", {{hidden, classes}}, m, P("R,S(0)"), Source::normal(0.3, 2));
  const ValueId b2 = add_weight(g, "b2", {{classes}}, m, P("R,R"), Source::normal(0.1, 3));
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kLinear}, {x, w1});
  const ValueId a = add_compute(g, "a", Op{.type = OpType::kRelu}, {h});
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kLinear}, {a, w2, b2});
  const ValueId r = add_parallel(g, "r", ParallelOp{.type = ParallelType::kReduction, .degree = 2},
                                 o, std::nullopt, P("S(0),R"));
  const ValueId loss = add_compute(g, "loss", Op{.type = OpType::kSoftmaxCrossEntropy}, {r, y});
  set_loss(g, loss);
  add_output(g, r);
  add_output(g, loss);
  return g;
}

Pcg pipeline(std::int64_t batch, std::int64_t in, std::int64_t out) {
  Pcg g;
  const DeviceMesh s0 = parse_mesh("2@0,1");
  const DeviceMesh s1 = parse_mesh("2@2,3");
  auto P = parse_placements;
  const ValueId x = add_input(g, "x", {{batch, in}}, s0, P("S(0)"), Source::normal(1, 21));
  const ValueId t = add_input(g, "t", {{batch, out}}, s1, P("S(0)"), Source::normal(1, 22));
  const ValueId w1 = add_weight(g, "w1", {{in, in}}, s0, P("R"), Source::normal(0.4, 23));
  const ValueId w2 = add_weight(g, "w2", {{in, out}}, s1, P("R"), Source::normal(0.4, 24));
  const ValueId h0 = add_compute(g, "h0", Op{.type = OpType::kLinear}, {x, w1});
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kTanh}, {h0});
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kLinear}, {h, w2}, s1);
  const ValueId loss = add_compute(g, "loss", Op{.type = OpType::kMse}, {o, t});
  set_loss(g, loss);
  add_output(g, loss);
  return g;
}

Pcg sp_mlp(int dp, int tp, std::int64_t batch, std::int64_t in, std::int64_t hidden,
           std::int64_t out) {
  Pcg g;
  const DeviceMesh m = dp == 1 ? make_mesh({tp}) : make_mesh({dp, tp});
  // Placements on the mesh: `on_tp` on the tp dim, `on_dp` on the dp dim (when there is one).
  auto P = [&](const char* on_dp, const char* on_tp) {
    return parse_placements(dp == 1 ? std::string(on_tp) : fmt::format("{},{}", on_dp, on_tp));
  };
  const ValueId x = add_input(g, "x", {{batch, in}}, m, P("S(0)", "S(0)"), Source::normal(1, 31));
  const ValueId t = add_input(g, "t", {{batch, out}}, m, P("S(0)", "S(0)"), Source::normal(1, 32));
  const ValueId w0 = add_weight(g, "w0", {{in, in}}, m, P("R", "R"), Source::normal(0.4, 33));
  const ValueId w1 =
      add_weight(g, "w1", {{in, hidden}}, m, P("R", "S(1)"), Source::normal(0.4, 34));
  const ValueId b1 = add_weight(g, "b1", {{hidden}}, m, P("R", "S(0)"), Source::normal(0.1, 35));
  const ValueId w2 =
      add_weight(g, "w2", {{hidden, out}}, m, P("R", "S(0)"), Source::normal(0.4, 36));
  const ValueId e =
      add_compute(g, "e", Op{.type = OpType::kMatmul}, {x, w0}, std::nullopt, P("S(0)", "S(0)"));
  const ValueId th = add_compute(g, "th", Op{.type = OpType::kTanh}, {e});
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kLinear}, {th, w1, b1}, std::nullopt,
                                P("S(0)", "S(1)"));
  const ValueId a = add_compute(g, "a", Op{.type = OpType::kGelu}, {h});
  const ValueId o =
      add_compute(g, "o", Op{.type = OpType::kMatmul}, {a, w2}, std::nullopt, P("S(0)", "S(0)"));
  const ValueId loss = add_compute(g, "loss", Op{.type = OpType::kMse}, {o, t});
  set_loss(g, loss);
  add_output(g, o);
  add_output(g, loss);
  return g;
}

Pcg stage_mlp(int stages, int tp, std::int64_t batch, std::int64_t width) {
  Pcg g;
  auto mesh_of = [&](int s) {
    std::vector<DeviceId> ids;
    for (int i = 0; i < tp; ++i) ids.push_back(s * tp + i);
    return make_mesh({tp}, ids);
  };
  auto P = parse_placements;
  const DeviceMesh last = mesh_of(stages - 1);
  ValueId h = add_input(g, "x", {{batch, width}}, mesh_of(0), P("R"), Source::normal(1, 41));
  const ValueId t = add_input(g, "t", {{batch, 3}}, last, P("R"), Source::normal(1, 42));
  for (int s = 0; s < stages; ++s) {
    const DeviceMesh m = mesh_of(s);
    const ValueId w = add_weight(g, fmt::format("w{}", s), {{width, width}}, m, P("S(1)"),
                                 Source::normal(0.5, static_cast<std::uint64_t>(43 + s)));
    const ValueId l = add_compute(g, fmt::format("l{}", s), Op{.type = OpType::kLinear}, {h, w}, m);
    h = add_compute(g, fmt::format("h{}", s), Op{.type = OpType::kTanh}, {l});
  }
  const ValueId w = add_weight(g, "w_out", {{width, 3}}, last, P("R"), Source::normal(0.5, 40));
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kLinear}, {h, w}, last);
  const ValueId loss = add_compute(g, "loss", Op{.type = OpType::kMse}, {o, t});
  set_loss(g, loss);
  add_output(g, loss);
  return g;
}

}  // namespace meshflow::testing

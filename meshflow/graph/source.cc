// Loading sources: .npy files, sharded folders and DESIGN's Philox initialisers.
#include "meshflow/graph/source.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/folder_io.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {

namespace {

// Fills `out` with the initialiser's values of the elements of `box` of the global tensor.
void fill_box(const Source& s, const Shape& global, const Box& box, Tensor& out) {
  visit_dtype(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      std::span<T> data = out.data<T>();
      if (s.kind == Source::Kind::kZeros || s.kind == Source::Kind::kFill) {
        std::fill(data.begin(), data.end(),
                  static_cast<T>(s.kind == Source::Kind::kFill ? s.a : 0));
        return;
      }
      const std::array<std::uint32_t, 2> key{static_cast<std::uint32_t>(s.seed),
                                             static_cast<std::uint32_t>(s.seed >> 32)};
      const std::size_t rank = global.size();
      std::vector<std::int64_t> idx(rank, 0);
      for (std::size_t k = 0; k < data.size(); ++k) {
        std::int64_t flat = 0;
        for (std::size_t d = 0; d < rank; ++d) flat = flat * global[d] + box.offset[d] + idx[d];
        const auto i = static_cast<std::uint64_t>(flat);
        const auto w = philox4x32_10(
            {static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), 0, 0}, key);
        const double a = static_cast<double>(w[0] >> 8) / 16777216.0;
        const double b = static_cast<double>(w[1] >> 8) / 16777216.0;
        double v = 0;
        if (s.kind == Source::Kind::kUniform) {
          v = s.a + (s.b - s.a) * a;
        } else {
          v = s.a * std::sqrt(-2.0 * std::log(1.0 - a)) * std::cos(2.0 * std::numbers::pi * b);
        }
        data[k] = static_cast<T>(v);
        for (std::size_t d = rank; d-- > 0;) {
          if (++idx[d] < box.extent[d]) break;
          idx[d] = 0;
        }
      }
    } else {
      fail(ErrorKind::kInvalidArgument, "an initialiser fills float32 or float64 tensors, not {}",
           to_string(out.dtype()));
    }
  });
}

Layout folder_layout_checked(const Node& node, const Layout& layout) {
  Layout on_disk = read_layout(node.source.path);
  if (on_disk != layout) {
    fail(ErrorKind::kShapeMismatch, "tensor \"{}\": folder \"{}\" holds {} but the model says {}",
         node.name, node.source.path.string(), to_string(on_disk), to_string(layout));
  }
  return on_disk;
}

// Returns the shape the source holds: the spec's, with dim 0 times the micro-batches.
Shape source_shape(const Node& node) {
  Shape s = node.spec.shape;
  if (node.micro_batches > 1) s[0] *= node.micro_batches;
  return s;
}

}  // namespace

void check_source(const Node& node, const Layout& layout) {
  try {
    switch (node.source.kind) {
      case Source::Kind::kNpy: {
        const NpyHeader h = read_npy_header(File::open_read(node.source.path));
        if (h.shape != node.spec.shape || h.dtype != node.spec.dtype) {
          fail(ErrorKind::kShapeMismatch, "\"{}\" holds {}{} but the model says {}{}",
               node.source.path.string(), to_string(h.dtype), to_string(h.shape),
               to_string(node.spec.dtype), to_string(node.spec.shape));
        }
        break;
      }
      case Source::Kind::kFolder:
        folder_layout_checked(node, layout);
        break;
      case Source::Kind::kData:
        break;
      default:
        if (!is_floating(node.spec.dtype)) {
          fail(ErrorKind::kInvalidArgument,
               "an initialiser fills float32 or float64 tensors, not {}",
               to_string(node.spec.dtype));
        }
        break;
    }
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("tensor \"")) throw;
    fail(e.kind(), "tensor \"{}\": {}", node.name, e.what());
  }
}

Tensor load_shard(const Node& node, const Layout& layout, DeviceId device) {
  const Box box = shard_box(layout, device);
  switch (node.source.kind) {
    case Source::Kind::kProvided:
    case Source::Kind::kData:
      return Tensor();
    case Source::Kind::kNpy:
      return slice(read_npy(node.source.path), box);
    case Source::Kind::kFolder: {
      // A folder in this layout with this device's file is read whole; any other (a checkpoint
      // saved on another mesh, or with one copy per replica group) box by box.
      const auto index = find_device(layout.mesh, device);
      MESHFLOW_CHECK(index.has_value());
      const Layout held = read_layout(node.source.path);
      if (held == layout && std::filesystem::exists(node.source.path / shard_file_name(*index)))
        return read_shard(node.source.path, layout, *index);
      return read_folder_box(node.source.path, held, box);
    }
    default: {
      Tensor out = Tensor::uninitialized(layout.dtype, box.extent);
      fill_box(node.source, layout.shape, box, out);
      return out;
    }
  }
}

Tensor load_global(const Node& node) {
  MESHFLOW_CHECK(node.source.kind != Source::Kind::kProvided, "\"{}\" is provided by its caller",
                 node.name);
  switch (node.source.kind) {
    case Source::Kind::kData:
      return Tensor();
    case Source::Kind::kNpy:
      return read_npy(node.source.path);
    case Source::Kind::kFolder: {
      const Layout held = read_layout(node.source.path);
      if (!partial_dims(held).empty()) {
        ShardedTensor t = read_sharded(node.source.path);
        return assemble(t.layout, t.shards);
      }
      return read_folder_box(node.source.path, held, full_box(held.shape));
    }
    default: {
      const Shape shape = source_shape(node);
      Tensor out = Tensor::uninitialized(node.spec.dtype, shape);
      fill_box(node.source, shape, full_box(shape), out);
      return out;
    }
  }
}

SourceShare::SourceShare(const Pcg& pcg, const TaskGraph& tasks, std::span<const DeviceId> local) {
  std::map<Key, int> holders;
  for (const DeviceTasks& dt : tasks.devices) {
    if (std::find(local.begin(), local.end(), dt.device) == local.end()) continue;
    for (ValueId v : dt.sources) {
      const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
      const bool drawn_alike =
          n.source.kind == Source::Kind::kNormal || n.source.kind == Source::Kind::kUniform;
      if (drawn_alike && n.micro_batches <= 1)
        ++holders[{v, shard_box(*n.layout, dt.device).offset}];
    }
  }
  for (const auto& [key, count] : holders)
    if (count > 1) entries_[key].takers = count;
}

int SourceShare::drawn() const {
  std::lock_guard lock(mu_);
  return drawn_;
}

SourceShare::Entries::iterator SourceShare::find(const Pcg& pcg, ValueId v, DeviceId device) {
  // Only the constructor adds entries: a micro-batched source has none.
  return entries_.find(
      {v, shard_box(*pcg.nodes[static_cast<std::size_t>(v)].layout, device).offset});
}

Tensor SourceShare::take(Entries::iterator it) {
  Entry& e = it->second;
  MESHFLOW_CHECK(e.ready && e.takers > 0, "a shared source taken before it is drawn");
  const bool last = --e.takers == 0;
  if (e.failure) {
    Error error(e.failure->kind, e.failure->message.c_str(), e.failure->scope);
    if (last) entries_.erase(it);
    throw error;
  }
  if (!last) return e.tensor.clone();
  Tensor out = std::move(e.tensor);
  entries_.erase(it);
  return out;
}

std::vector<Tensor> load_sources(const Pcg& pcg, const DeviceTasks& tasks, SourceShare* share) {
  std::vector<Tensor> values(pcg.nodes.size());
  // Boxes another device is drawing, taken once the device's other sources are loaded. Their
  // entries stay in the map until this device takes them (it is one of their takers).
  std::vector<std::pair<ValueId, SourceShare::Entries::iterator>> drawn_elsewhere;
  for (ValueId v : tasks.sources) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
    Tensor& value = values[static_cast<std::size_t>(v)];
    std::unique_lock<std::mutex> lock;
    auto it = SourceShare::Entries::iterator();
    if (share) {
      lock = std::unique_lock(share->mu_);
      it = share->find(pcg, v, tasks.device);
    }
    if (!share || it == share->entries_.end()) {
      if (lock) lock.unlock();
      value = n.micro_batches > 1 ? load_micro_batch(n, *n.layout, tasks.device, 0)
                                  : load_shard(n, *n.layout, tasks.device);
      continue;
    }
    SourceShare::Entry& e = it->second;
    if (e.ready) {
      value = share->take(it);
    } else if (e.claimed) {
      drawn_elsewhere.emplace_back(v, it);
    } else {
      e.claimed = true;
      lock.unlock();
      Tensor drawn;
      std::optional<SourceShare::Entry::Failure> failure;
      try {
        drawn = load_shard(n, *n.layout, tasks.device);
      } catch (const Error& error) {
        failure = {error.kind(), error.what(), error.scope()};
      } catch (const std::exception& error) {
        failure = {ErrorKind::kInternal, error.what(), ErrorScope::kThisDevice};
      } catch (...) {
        failure = {ErrorKind::kInternal, "drawing a shared source failed", ErrorScope::kThisDevice};
      }
      lock.lock();
      e.tensor = std::move(drawn);
      e.failure = std::move(failure);
      e.ready = true;
      ++share->drawn_;
      share->ready_.notify_all();
      value = share->take(it);
    }
  }
  for (const auto& [v, it] : drawn_elsewhere) {
    std::unique_lock lock(share->mu_);
    share->ready_.wait(lock, [&] { return it->second.ready; });
    values[static_cast<std::size_t>(v)] = share->take(it);
  }
  return values;
}

Tensor load_micro_batch(const Node& node, const Layout& layout, DeviceId device, int m) {
  MESHFLOW_CHECK(node.micro_batches > 1 && m >= 0 && m < node.micro_batches,
                 "micro-batch {} of \"{}\"", m, node.name);
  Box box = shard_box(layout, device);
  box.offset[0] += static_cast<std::int64_t>(m) * layout.shape[0];
  switch (node.source.kind) {
    case Source::Kind::kData:
      return Tensor();
    case Source::Kind::kNpy:
      return slice(read_npy(node.source.path), box);
    case Source::Kind::kFolder:
      return slice(load_global(node), box);
    default: {
      Tensor out = Tensor::uninitialized(layout.dtype, box.extent);
      fill_box(node.source, source_shape(node), box, out);
      return out;
    }
  }
}

std::vector<std::vector<Tensor>> load_micro_batches(const Pcg& pcg, const DeviceTasks& tasks) {
  std::vector<std::vector<Tensor>> out(pcg.nodes.size());
  for (ValueId v : tasks.sources) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
    for (int m = 0; m < n.micro_batches && n.micro_batches > 1; ++m)
      out[static_cast<std::size_t>(v)].push_back(load_micro_batch(n, *n.layout, tasks.device, m));
  }
  return out;
}

}  // namespace meshflow

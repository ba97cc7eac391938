// Streaming shard and gather. A slab of the global tensor (for_each_slab: contiguous in the
// .npy file) meets a shard box in a region that is contiguous in that shard's own file too (the
// slab fixes the dims before some dim j, ranges over j and spans every later dim, so the region
// spans the box on every later dim), so each region is one positioned read or write.
#include "meshflow/mesh/folder_io.h"

#include <cstring>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {

namespace fs = std::filesystem;

namespace {

// A byte buffer viewed as a row-major tensor of `shape`, for copy_box.
struct View {
  std::byte* data;
  Shape shape;
  std::size_t es;
  ConstBuffer in() const { return {data, &shape, es}; }
  MutableBuffer out() { return {data, &shape, es}; }
};

std::vector<std::int64_t> relative(const Box& box, const Box& to) {
  std::vector<std::int64_t> out(box.offset.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = box.offset[i] - to.offset[i];
  return out;
}

// Returns the byte offset of `region` (inside `box`) in the file of the shard holding `box`.
std::int64_t offset_in_shard(const Box& region, const Box& box, std::int64_t data_offset,
                             std::size_t es) {
  const auto flat = contiguous_offset(region, box);
  MESHFLOW_CHECK(flat.has_value(), "region {} is not contiguous in shard box {}", to_string(region),
                 to_string(box));
  return data_offset + *flat * static_cast<std::int64_t>(es);
}

std::span<std::byte> bytes_of(std::vector<std::byte>& buf, std::int64_t elems, std::size_t es) {
  return {buf.data(), static_cast<std::size_t>(elems) * es};
}

}  // namespace

Layout shard_file(const fs::path& input, const DeviceMesh& mesh,
                  const std::vector<Placement>& placements, const fs::path& out,
                  const Progress& progress) {
  const File src = File::open_read(input);
  const NpyHeader h = read_npy_header(src);
  const Layout layout = make_layout(mesh, placements, h.shape, h.dtype);
  check_shardable(layout);
  const std::size_t es = size_of(layout.dtype);
  const int n = size(layout.mesh);
  std::vector<Box> boxes;
  std::vector<std::int64_t> data_offsets;
  for (DeviceId d : layout.mesh.devices) boxes.push_back(shard_box(layout, d));
  const fs::path staged = stage_folder(out);
  try {
    write_file_atomic(staged / "layout.json", layout_to_json(layout).dump(2) + "\n");
    for (int i = 0; i < n; ++i) {
      const std::string header = encode_npy_header(layout.dtype, boxes[i].extent);
      File::create(staged / shard_file_name(i))
          .write_at(0, std::as_bytes(std::span<const char>(header.data(), header.size())));
      data_offsets.push_back(static_cast<std::int64_t>(header.size()));
    }
    const std::int64_t slab_elems = kIoSlabBytes / static_cast<std::int64_t>(es);
    std::vector<std::byte> slab_buf(static_cast<std::size_t>(kIoSlabBytes));
    std::vector<std::byte> staging(static_cast<std::size_t>(kIoSlabBytes));
    const Box global = full_box(layout.shape);
    for_each_slab(layout.shape, slab_elems, [&](const Box& slab) {
      View view{slab_buf.data(), slab.extent, es};
      bool read = false;
      for (int i = 0; i < n; ++i) {
        const Box part = intersect(slab, boxes[i]);
        if (numel(part) == 0) continue;
        if (!read) {
          src.read_at(h.data_offset + *contiguous_offset(slab, global) * static_cast<int64_t>(es),
                      bytes_of(slab_buf, numel(slab), es));
          read = true;
        }
        const std::byte* from = nullptr;
        if (auto at = contiguous_offset(part, slab)) {
          from = slab_buf.data() + *at * static_cast<std::int64_t>(es);
        } else {
          Shape ext = part.extent;
          copy_box(view.in(), relative(part, slab), MutableBuffer{staging.data(), &ext, es},
                   std::vector<std::int64_t>(ext.size(), 0), part.extent);
          from = staging.data();
        }
        File::open_write(staged / shard_file_name(i))
            .write_at(offset_in_shard(part, boxes[i], data_offsets[i], es),
                      {from, static_cast<std::size_t>(numel(part)) * es});
      }
      if (progress) {
        const auto slab_end = *contiguous_offset(slab, global) + numel(slab);
        progress(slab_end * static_cast<std::int64_t>(es),
                 numel(layout.shape) * static_cast<std::int64_t>(es));
      }
    });
  } catch (...) {
    discard(staged);
    throw;
  }
  commit_folder(staged, out);
  return layout;
}

namespace {

// Checks every shard file of `in` against `layout` and returns where each one's data starts
// (-1 for a replica's file that is absent: a checkpoint writes one copy per replica group).
std::vector<std::int64_t> check_shard_files(const fs::path& in, const Layout& layout) {
  std::vector<std::int64_t> data_offsets;
  for (int i = 0; i < size(layout.mesh); ++i) {
    const fs::path path = in / shard_file_name(i);
    if (!is_representative(layout, layout.mesh.devices[i]) && !fs::exists(path)) {
      data_offsets.push_back(-1);
      continue;
    }
    const File file = File::open_read(path);
    const NpyHeader h = read_npy_header(file);
    const DeviceId d = layout.mesh.devices[i];
    const Box box = shard_box(layout, d);
    if (h.dtype != layout.dtype || h.shape != box.extent) {
      fail(ErrorKind::kIo, "{}: holds {} {} but layout.json gives device {} box {} ({} {})",
           file.path().string(), to_string(h.shape), to_string(h.dtype), d, to_string(box),
           to_string(box.extent), to_string(layout.dtype));
    }
    data_offsets.push_back(h.data_offset);
  }
  return data_offsets;
}

// Compares every device's shard with its replica reference's, slab by slab.
void check_replica_files(const fs::path& in, const Layout& layout,
                         const std::vector<std::int64_t>& data_offsets) {
  const std::size_t es = size_of(layout.dtype);
  std::vector<std::byte> a(static_cast<std::size_t>(kIoSlabBytes));
  std::vector<std::byte> b(static_cast<std::size_t>(kIoSlabBytes));
  for (int i = 0; i < size(layout.mesh); ++i) {
    const DeviceId d = layout.mesh.devices[i];
    const auto reference = replica_reference(layout, d);
    if (!reference) continue;
    const int j = *find_device(layout.mesh, *reference);
    if (data_offsets[i] < 0 || data_offsets[j] < 0) continue;  // one copy written
    const File mine = File::open_read(in / shard_file_name(i));
    const File theirs = File::open_read(in / shard_file_name(j));
    const std::int64_t total = numel(shard_box(layout, d).extent) * static_cast<std::int64_t>(es);
    for (std::int64_t at = 0; at < total; at += kIoSlabBytes) {
      const auto len = static_cast<std::size_t>(std::min(kIoSlabBytes, total - at));
      mine.read_at(data_offsets[i] + at, {a.data(), len});
      theirs.read_at(data_offsets[j] + at, {b.data(), len});
      if (std::memcmp(a.data(), b.data(), len) != 0) fail_replicas_disagree(layout, d);
    }
  }
}

}  // namespace

Layout gather_file(const fs::path& in, const fs::path& out, const Progress& progress) {
  const Layout layout = read_layout(in);
  const std::vector<std::int64_t> data_offsets = check_shard_files(in, layout);
  check_replica_files(in, layout, data_offsets);
  const std::size_t es = size_of(layout.dtype);
  const PartialGroup group = partial_group(layout);
  std::int64_t terms = 1;
  for (std::int64_t s : group.sizes) terms *= s;
  // Every term of a region is in memory at once: slabs shrink as the number of terms grows.
  const std::int64_t slab_elems =
      std::max<std::int64_t>(1024, kIoSlabBytes / terms / static_cast<std::int64_t>(es));
  struct Source {
    int index;  // mesh position of the representative
    Box box;
    std::vector<int> terms;  // mesh positions of its Partial group, row-major
  };
  std::vector<Source> sources;
  for (int i = 0; i < size(layout.mesh); ++i) {
    const DeviceId d = layout.mesh.devices[i];
    if (!is_representative(layout, d)) continue;
    Source s{i, shard_box(layout, d), {}};
    for (DeviceId t : group_along(layout.mesh, d, group.dims))
      s.terms.push_back(*find_device(layout.mesh, t));
    sources.push_back(std::move(s));
  }
  const fs::path target = output_target(out);
  clear_stale(target);
  const fs::path staged = staging_path(target);
  try {
    const File dst = File::create(staged);
    const std::string header = encode_npy_header(layout.dtype, layout.shape);
    dst.write_at(0, std::as_bytes(std::span<const char>(header.data(), header.size())));
    const auto data_start = static_cast<std::int64_t>(header.size());
    const auto slab_bytes = static_cast<std::size_t>(slab_elems) * es;
    std::vector<std::byte> slab_buf(slab_bytes), reduced(slab_bytes);
    std::vector<std::vector<std::byte>> term_bufs(static_cast<std::size_t>(terms),
                                                  std::vector<std::byte>(slab_bytes));
    const Box global = full_box(layout.shape);
    for_each_slab(layout.shape, slab_elems, [&](const Box& slab) {
      View view{slab_buf.data(), slab.extent, es};
      for (const Source& s : sources) {
        const Box part = intersect(slab, s.box);
        if (numel(part) == 0) continue;
        const auto len = static_cast<std::size_t>(numel(part)) * es;
        std::vector<const std::byte*> term_ptrs;
        for (std::size_t t = 0; t < s.terms.size(); ++t) {
          const int k = s.terms[t];
          File::open_read(in / shard_file_name(k))
              .read_at(offset_in_shard(part, s.box, data_offsets[k], es),
                       {term_bufs[t].data(), len});
          term_ptrs.push_back(term_bufs[t].data());
        }
        reduce_partial_terms(group.ops, group.sizes, layout.dtype, term_ptrs, reduced.data(),
                             numel(part));
        Shape ext = part.extent;
        copy_box(ConstBuffer{reduced.data(), &ext, es}, std::vector<std::int64_t>(ext.size(), 0),
                 view.out(), relative(part, slab), part.extent);
      }
      const std::int64_t at = *contiguous_offset(slab, global);
      dst.write_at(data_start + at * static_cast<std::int64_t>(es),
                   {slab_buf.data(), static_cast<std::size_t>(numel(slab)) * es});
      if (progress) {
        progress((at + numel(slab)) * static_cast<std::int64_t>(es),
                 numel(layout.shape) * static_cast<std::int64_t>(es));
      }
    });
  } catch (...) {
    discard(staged);
    throw;
  }
  publish(staged, target);
  return layout;
}

Tensor read_folder_box(const fs::path& dir, const Layout& layout, const Box& box) {
  MESHFLOW_CHECK(partial_dims(layout).empty(), "a box of a Partial folder");
  const std::size_t es = size_of(layout.dtype);
  Tensor out = Tensor::uninitialized(layout.dtype, box.extent);
  MutableBuffer to{out.bytes(), &out.shape(), es};
  std::vector<std::byte> buf;
  const std::size_t rank = layout.shape.size();
  for (int i = 0; i < size(layout.mesh); ++i) {
    const DeviceId d = layout.mesh.devices[i];
    if (!is_representative(layout, d)) continue;
    const Box held = shard_box(layout, d);
    const Box part = intersect(box, held);
    if (numel(part) == 0) continue;
    const File file = File::open_read(dir / shard_file_name(i));
    const NpyHeader h = read_npy_header(file);
    if (h.dtype != layout.dtype || h.shape != held.extent) {
      fail(ErrorKind::kIo, "{}: holds {} {} but layout.json gives device {} box {} ({} {})",
           file.path().string(), to_string(h.shape), to_string(h.dtype), d, to_string(held),
           to_string(held.extent), to_string(layout.dtype));
    }
    const std::vector<Box> runs = contiguous_runs(part, {held});  // in file order
    const auto run_bytes = numel(runs.front().extent) * static_cast<std::int64_t>(es);
    // A large run contiguous in the result too is read straight into it; the others are read
    // a window of neighbouring runs at a time (at most kIoSlabBytes, gaps included): few large
    // reads rather than one per row.
    const bool large = run_bytes >= kIoSlabBytes / 8;
    std::size_t r = 0;
    while (r < runs.size()) {
      const std::int64_t start = offset_in_shard(runs[r], held, h.data_offset, es);
      if (const auto at = contiguous_offset(runs[r], box); large && at) {
        file.read_at(start, {out.bytes() + *at * static_cast<std::int64_t>(es),
                             static_cast<std::size_t>(run_bytes)});
        ++r;
        continue;
      }
      std::size_t end = r + 1;
      while (end < runs.size() && !(large && contiguous_offset(runs[end], box)) &&
             offset_in_shard(runs[end], held, h.data_offset, es) + run_bytes - start <=
                 kIoSlabBytes)
        ++end;
      const std::int64_t stop = offset_in_shard(runs[end - 1], held, h.data_offset, es) + run_bytes;
      buf.resize(static_cast<std::size_t>(stop - start));
      file.read_at(start, {buf.data(), buf.size()});
      for (; r < end; ++r) {
        const std::int64_t from = offset_in_shard(runs[r], held, h.data_offset, es) - start;
        Shape ext = runs[r].extent;
        copy_box(ConstBuffer{buf.data() + from, &ext, es}, std::vector<std::int64_t>(rank, 0), to,
                 relative(runs[r], box), runs[r].extent);
      }
    }
  }
  return out;
}

}  // namespace meshflow

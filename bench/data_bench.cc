// The data bench: a stream written and touched once, then step after step of box reads.
#include "bench/data_bench.h"

#include <fmt/format.h>

#include <cstring>

#include "bench/collectives_bench.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/data/batch.h"

namespace meshflow::bench {

namespace {

namespace fs = std::filesystem;

// Writes a 1-d uint16 .npy of `tokens` ids (i mod 50,021) at `path`, a MiB at a time.
void write_stream(const fs::path& path, std::int64_t tokens) {
  const std::string header = encode_npy_header("<u2", {tokens});
  const File f = File::create(path);
  f.write_at(0, std::as_bytes(std::span(header.data(), header.size())));
  std::vector<std::uint16_t> chunk(std::size_t{1} << 19);
  for (std::int64_t at = 0; at < tokens; at += static_cast<std::int64_t>(chunk.size())) {
    const std::int64_t n =
        std::min<std::int64_t>(tokens - at, static_cast<std::int64_t>(chunk.size()));
    for (std::int64_t i = 0; i < n; ++i)
      chunk[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>((at + i) % 50021);
    f.write_at(static_cast<std::int64_t>(header.size()) + at * 2,
               std::as_bytes(std::span(chunk.data(), static_cast<std::size_t>(n))));
  }
}

}  // namespace

BenchReport run_data_bench(const DataBenchOptions& o) {
  BenchReport report{.benchmark = "data", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const TempFolder folder("meshflow_data_bench");
  const fs::path dir = o.dir.empty() ? folder.path() : o.dir;
  const fs::path path = dir / fmt::format("stream_{}.npy", ::getpid());
  const std::int64_t tokens = o.stream_bytes / 2;
  write_stream(path, tokens);
  struct Remove {
    fs::path p;
    ~Remove() { fs::remove(p); }
  } remove{path};
  const nlohmann::json j = {{"train", path.string()}, {"order", "sequential"}};
  const DataSpec spec = parse_data_spec(JsonField(j, "bench"), "/");
  const std::vector<DataInput> inputs = {
      {.tensor = "tokens", .name = "window", .shift = 0, .shape = {o.batch, o.seq}},
      {.tensor = "next", .name = "window", .shift = 1, .shape = {o.batch, o.seq}}};
  const RowOrder order = train_order(spec, inputs);
  const SplitReader reader(spec.train);
  ShuffleCache cache;
  // The pages touched beforehand: the whole stream read once through a map of its own, which
  // the floor then copies its source bytes out of (so that both read the stream from memory).
  std::uint64_t sum = 0;
  {
    const MappedFile touch = MappedFile::open(path);
    for (std::int64_t at = 0; at < touch.size(); at += 4096)
      sum += static_cast<std::uint8_t>(touch.data()[at]);
  }
  const MappedFile stream = MappedFile::open(path);
  const Box box = full_box(inputs[0].shape);
  const std::int64_t rows_bytes = o.batch * o.seq * 2;
  const std::int64_t src_bytes = 2 * rows_bytes, dst_bytes = 2 * o.batch * o.seq * 8;
  std::vector<std::byte> src(static_cast<std::size_t>(src_bytes)),
      dst_a(static_cast<std::size_t>(dst_bytes)), dst_b(dst_a.size());
  BenchResult r{
      .case_name = "read", .backend = "host", .mesh = "1", .devices = 1, .bytes = dst_bytes};
  const std::int64_t steps = order.units / o.batch;
  std::int64_t sink = static_cast<std::int64_t>(sum);
  for (int rep = 0; rep < o.reps + 1; ++rep) {
    const std::int64_t step = rep % steps;
    const double read = time_once([&] {
      for (const DataInput& in : inputs) {
        const Tensor t = read_box(reader, order, cache, in, step * o.batch, box);
        sink += t.data<std::int64_t>()[0];
      }
    });
    // The floor's source: the rows of a step half the stream away, as cold as the case's.
    const std::byte* far = stream.data() + 128 + ((step + steps / 2) % steps) * rows_bytes;
    const double floor = time_once([&] {
      std::memcpy(src.data(), far, static_cast<std::size_t>(rows_bytes));
      std::memcpy(src.data() + rows_bytes, far + 2, static_cast<std::size_t>(rows_bytes));
      std::memcpy(dst_b.data(), dst_a.data(), dst_a.size());
    });
    if (rep == 0) continue;  // the first rep maps what the runs after it read
    r.case_s.push_back(read);
    r.floor_s.push_back(floor);
  }
  r.extra["source_bytes"] = src_bytes;
  r.extra["stream_bytes"] = o.stream_bytes;
  r.extra["order"] = "sequential";
  r.extra["checksum"] = sink;
  add_result(report, std::move(r));
  return report;
}

}  // namespace meshflow::bench

// The cache of this machine's description: the key and its file, what is trusted, and the
// read-or-measure in a folder of the test's own (one short calibration per measurement).
#include "meshflow/auto/machine_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"

namespace meshflow {
namespace {

// A folder of this test's own, removed at the end.
struct Folder {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("meshflow_machine_cache_" + std::to_string(::getpid()) + "_" +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Folder() { std::filesystem::remove_all(path); }
  ~Folder() { std::filesystem::remove_all(path); }
};

int count_files(const std::filesystem::path& folder) {
  if (!std::filesystem::exists(folder)) return 0;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(folder)) n += e.is_regular_file();
  return n;
}

// The options of a test: its folder, one calibration, and the lines noted.
struct Noted {
  std::vector<std::string> lines;
  MachineCacheOptions options(const std::filesystem::path& folder) {
    return {.folder = folder, .calibrations = 1, .note = [this](const std::string& line) {
              lines.push_back(line);
            }};
  }
  int measurements() const {
    int n = 0;
    for (const std::string& l : lines) n += l.starts_with("measuring this machine");
    return n;
  }
};

TEST(MachineKey, NamesWhatChangesTheFigures) {
  const MachineKey k = machine_key(Backend::kThreads, 2, 1);
  EXPECT_FALSE(k.cpu.empty());
  EXPECT_GE(k.cores, 1);
  EXPECT_EQ(k.devices, 2);
  EXPECT_EQ(k.threads_per_device, 1);
  EXPECT_EQ(machine_key(Backend::kThreads, 2, 0).threads_per_device, std::max(1, k.cores / 2));
  // Beyond kMostMeasuredDevicesPerCore a core, devices are measured as that many.
  EXPECT_EQ(machine_key(Backend::kThreads, 100000, 1).devices,
            kMostMeasuredDevicesPerCore * k.cores);
  const std::string name = machine_cache_file(k, "/c").filename().string();
  EXPECT_TRUE(name.starts_with("machine-threads-2x1-")) << name;
  EXPECT_TRUE(name.ends_with(".json")) << name;
  EXPECT_EQ(name.find(' '), std::string::npos) << name;
  EXPECT_NE(machine_cache_file(k, "/c"),
            machine_cache_file(machine_key(Backend::kThreads, 2, 2), "/c"));
  EXPECT_NE(machine_cache_file(k, "/c"),
            machine_cache_file(machine_key(Backend::kMpi, 2, 1), "/c"));
  EXPECT_NE(to_string(k).find(k.cpu), std::string::npos);
}

TEST(MachineCacheText, ReadsBackOnlyForItsKeyAndVersion) {
  const MachineKey k = machine_key(Backend::kThreads, 2, 1);
  MachineModel m = default_machine();
  m.gemm_gflops = 123.5;
  const std::string text = machine_cache_text(k, m);
  EXPECT_EQ(machine_from_cache_text(text, k, "c.json"), m);
  MachineKey other = k;
  other.threads_per_device = 2;
  EXPECT_THROW(machine_from_cache_text(text, other, "c.json"), Error);
  nlohmann::json j = nlohmann::json::parse(text);
  j["version"] = kMachineCacheVersion + 1;
  try {
    machine_from_cache_text(j.dump(), k, "c.json");
    ADD_FAILURE() << "another version was trusted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("version"), std::string::npos) << e.what();
  }
  EXPECT_THROW(machine_from_cache_text(text.substr(0, text.size() / 2), k, "c.json"), Error);
  EXPECT_THROW(machine_from_cache_text("{}", k, "c.json"), Error);
}

TEST(MachineCache, MeasuresOnceThenReads) {
  Folder f;
  Noted noted;
  const MachineKey k = machine_key(Backend::kThreads, 1, 1);
  const std::optional<MachineModel> first = cached_machine(k, noted.options(f.path));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(noted.measurements(), 1);
  EXPECT_TRUE(std::filesystem::exists(machine_cache_file(k, f.path)));
  // The measured figures, not the built-in ones.
  EXPECT_NE(first->gemm_gflops, default_machine().gemm_gflops);

  const std::optional<MachineModel> second = cached_machine(k, noted.options(f.path));
  EXPECT_EQ(noted.measurements(), 1) << "the second read measured";
  EXPECT_EQ(second, first);

  // Another key (threads per device) is measured on its own, beside the first.
  const MachineKey two = machine_key(Backend::kThreads, 1, 2);
  ASSERT_TRUE(cached_machine(two, noted.options(f.path)).has_value());
  EXPECT_EQ(noted.measurements(), 2);
  EXPECT_EQ(count_files(f.path), 2);

  // A refresh measures again even though the file is trusted.
  cached_machine(
      k,
      {.folder = f.path, .refresh = true, .calibrations = 1, .note = noted.options(f.path).note});
  EXPECT_EQ(noted.measurements(), 3);
}

TEST(MachineKey, KernelRegimeIsTheBusyCoresAndTheirThreads) {
  const MachineKey k = machine_key(Backend::kThreads, 1, 1);
  MachineKey a = k, b = k;
  a.cores = b.cores = 2;
  a.devices = 2, b.devices = 4;  // both keep 2 cores busy with one thread a device
  EXPECT_TRUE(same_kernel_regime(a, b));
  b.devices = 1;  // one core busy
  EXPECT_FALSE(same_kernel_regime(a, b));
  b = a;
  b.threads_per_device = 2;
  EXPECT_FALSE(same_kernel_regime(a, b));
  b = a;
  b.backend = Backend::kMpi;
  EXPECT_FALSE(same_kernel_regime(a, b));
  b = a;
  b.cpu = a.cpu + " v2";
  EXPECT_FALSE(same_kernel_regime(a, b));
}

TEST(MachineCache, KeysOfOneKernelRegimeShareTheKernelRates) {
  Folder f;
  // One device and two, each with every core's threads: every core busy either way.
  const MachineKey one = machine_key(Backend::kThreads, 1, 0);
  const MachineKey two = machine_key(Backend::kThreads, 2, one.threads_per_device);
  ASSERT_TRUE(same_kernel_regime(one, two));
  MachineModel planted = default_machine();
  planted.gemm_gflops = 12.5;
  planted.elementwise_gbps = 0.75;
  const std::filesystem::path one_file = machine_cache_file(one, f.path);
  std::filesystem::create_directories(f.path);
  write_file_atomic(one_file, machine_cache_text(one, planted));

  // Measured after `one`: its kernel rates are one's, the rest its own; one line names the file.
  Noted noted;
  const std::optional<MachineModel> measured = cached_machine(two, noted.options(f.path));
  ASSERT_TRUE(measured.has_value());
  EXPECT_EQ(noted.measurements(), 1);
  EXPECT_EQ(measured->gemm_gflops, 12.5);
  EXPECT_EQ(measured->elementwise_gbps, 0.75);
  EXPECT_NE(measured->memcpy_gbps, planted.memcpy_gbps);
  int naming = 0;
  for (const std::string& l : noted.lines) naming += l.find(one_file.string()) != std::string::npos;
  EXPECT_EQ(naming, 1);
  EXPECT_EQ(cached_machine(two, noted.options(f.path)), measured);

  // A refresh measures them again and writes them into one's file too, the rest of it kept.
  const std::optional<MachineModel> fresh = cached_machine(
      two,
      {.folder = f.path, .refresh = true, .calibrations = 1, .note = noted.options(f.path).note});
  ASSERT_TRUE(fresh.has_value());
  EXPECT_NE(fresh->gemm_gflops, 12.5);
  const MachineModel one_after = machine_from_cache_text(read_file(one_file), one, "one");
  EXPECT_EQ(one_after.gemm_gflops, fresh->gemm_gflops);
  EXPECT_EQ(one_after.elementwise_gbps, fresh->elementwise_gbps);
  EXPECT_EQ(one_after.memcpy_gbps, planted.memcpy_gbps);
}

TEST(MachineCache, CorruptOrForeignFileIsMeasuredOverWithOneLine) {
  Folder f;
  const MachineKey k = machine_key(Backend::kThreads, 1, 1);
  const std::filesystem::path file = machine_cache_file(k, f.path);
  std::filesystem::create_directories(f.path);
  for (const std::string& bad :
       {std::string("{\"version\": 1, \"key\": "), std::string("\xff\xfe garbage"),
        nlohmann::json{{"version", 0}, {"key", {}}, {"machine", {}}}.dump()}) {
    write_file_atomic(file, bad);
    Noted noted;
    const std::optional<MachineModel> m = cached_machine(k, noted.options(f.path));
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(noted.measurements(), 1);
    ASSERT_GE(noted.lines.size(), 2u);
    EXPECT_NE(noted.lines[0].find(file.string()), std::string::npos) << noted.lines[0];
    EXPECT_NE(noted.lines[0].find("measuring this machine again"), std::string::npos)
        << noted.lines[0];
    // Written over: trusted now.
    EXPECT_EQ(machine_from_cache_text(read_file(file), k, "c"), *m);
  }
}

TEST(MachineCache, WithoutMeasuringAnEmptyCacheGivesNothing) {
  Folder f;
  const MachineKey k = machine_key(Backend::kThreads, 1, 1);
  MachineCacheOptions o{.folder = f.path, .measure = false};
  EXPECT_FALSE(cached_machine(k, o).has_value());
  EXPECT_EQ(count_files(f.path), 0);
  const ChosenMachine chosen = choose_machine({}, k, o);
  EXPECT_EQ(chosen.machine, default_machine());
  EXPECT_TRUE(chosen.source.starts_with("built-in")) << chosen.source;
}

TEST(MachineChoice, DefaultAndFileNeverTouchTheCache) {
  Folder f;
  const MachineKey k = machine_key(Backend::kThreads, 1, 1);
  EXPECT_EQ(parse_machine_choice("").kind, MachineChoice::Kind::kMeasured);
  const ChosenMachine built_in =
      choose_machine(parse_machine_choice("default"), k, {.folder = f.path});
  EXPECT_EQ(built_in.machine, default_machine());
  EXPECT_EQ(built_in.source, "built-in");

  MachineModel m = default_machine();
  m.memcpy_gbps = 3.25;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("meshflow_machine_choice_" + std::to_string(::getpid()) + ".json");
  write_file_atomic(file, machine_to_json(m).dump());
  const ChosenMachine given =
      choose_machine(parse_machine_choice(file.string()), k, {.folder = f.path});
  EXPECT_EQ(given.machine, m);
  EXPECT_EQ(given.source, file.string());
  std::filesystem::remove(file);
  EXPECT_FALSE(std::filesystem::exists(f.path));
}

}  // namespace
}  // namespace meshflow

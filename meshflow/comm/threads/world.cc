// Rendezvous, point-to-point matching and failure propagation for the threads backend.
#include "meshflow/comm/threads/world.h"

#include <cstring>
#include <thread>

#include "meshflow/core/error.h"

namespace meshflow::threads {

namespace {

// How often a waiting rank yields its core before it sleeps on the condition variable.
constexpr int kYieldsBeforeSleep = 16;

std::string list(const std::vector<DeviceId>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}

}  // namespace

std::vector<const void*> Group::arrive(std::uint64_t seq, int rank, int phase,
                                       std::shared_ptr<const void> args, Timeout timeout,
                                       const std::string& what) {
  const int n = size();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(mu_);
  Slot& slot = slots_[seq];
  if (slot.args.empty()) {
    slot.args.assign(n, nullptr);
    slot.keep.resize(n);
  }
  if (static_cast<int>(slot.count.size()) <= phase) {
    slot.count.resize(phase + 1, 0);
    slot.arrived.resize(phase + 1, std::vector<char>(n, 0));
  }
  if (phase == 0) {
    slot.args[rank] = args.get();
    slot.keep[rank] = std::move(args);
  }
  slot.arrived[phase][rank] = 1;
  if (++slot.count[phase] == n) cv_.notify_all();

  auto missing = [&] {
    std::vector<DeviceId> out;
    for (int r = 0; r < n; ++r) {
      if (!slot.arrived[phase][r]) out.push_back(devices_[r]);
    }
    return out;
  };
  auto missing_exited = [&]() -> std::optional<DeviceId> {
    for (int r = 0; r < n; ++r) {
      if (!slot.arrived[phase][r] && world_.exited(devices_[r])) return devices_[r];
    }
    return std::nullopt;
  };
  // Yield the core a few times before sleeping: with more device threads than cores, the
  // missing rank is usually runnable and arrives within a time slice, and a sleep/wake pair
  // costs more than that.
  for (int spin = 0; spin < kYieldsBeforeSleep && slot.count[phase] < n && !world_.failure();
       ++spin) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  while (slot.count[phase] < n) {
    if (slot.abandoned)
      fail(ErrorKind::kCommunication, "{} was abandoned: {}", what, *slot.abandoned);
    if (auto f = world_.failure())
      abandon(slot, ErrorKind::kCommunication, fmt::format("{} failed: {}", what, *f));
    if (auto gone = missing_exited()) {
      abandon(
          slot, ErrorKind::kCommunication,
          fmt::format("{} failed: device {} finished its program without joining it", what, *gone));
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && slot.count[phase] < n) {
      abandon(slot, ErrorKind::kTimeout,
              fmt::format("{} timed out after {} ms: devices [{}] never arrived", what,
                          timeout.count(), list(missing())));
    }
  }
  if (slot.abandoned)
    fail(ErrorKind::kCommunication, "{} was abandoned: {}", what, *slot.abandoned);
  return slot.args;
}

void Group::abandon(Slot& slot, ErrorKind kind, const std::string& message) {
  slot.abandoned = message;
  cv_.notify_all();
  throw Error(kind, message);
}

std::int64_t Group::claim(std::uint64_t seq, int step) {
  std::atomic<std::int64_t>* counter = nullptr;
  {
    std::lock_guard lock(mu_);
    counter = &slots_.at(seq).next_piece.at(step);
  }
  return counter->fetch_add(1, std::memory_order_relaxed);
}

void Group::finish(std::uint64_t seq, int step, std::int64_t done, std::int64_t total,
                   Timeout timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::atomic<std::int64_t>* counter = nullptr;
  {
    std::lock_guard lock(mu_);
    counter = &slots_.at(seq).done_pieces.at(step);
  }
  // Release: the pieces' writes happen before any rank sees them counted (acquire below).
  if (counter->fetch_add(done, std::memory_order_acq_rel) + done >= total) {
    if (done > 0) {
      std::lock_guard lock(mu_);
      cv_.notify_all();
    }
    return;
  }
  for (int spin = 0; spin < kYieldsBeforeSleep; ++spin) {
    std::this_thread::yield();
    if (counter->load(std::memory_order_acquire) >= total) return;
  }
  std::unique_lock lock(mu_);
  Slot& slot = slots_.at(seq);
  while (counter->load(std::memory_order_acquire) < total) {
    if (slot.abandoned)
      fail(ErrorKind::kCommunication, "{} was abandoned: {}", what, *slot.abandoned);
    if (auto f = world_.failure())
      abandon(slot, ErrorKind::kCommunication, fmt::format("{} failed: {}", what, *f));
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        counter->load(std::memory_order_acquire) < total) {
      abandon(slot, ErrorKind::kTimeout,
              fmt::format("{} timed out after {} ms: {} of its {} pieces of work done", what,
                          timeout.count(), counter->load(), total));
    }
  }
}

void Group::leave(std::uint64_t seq, int /*rank*/) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(seq);
  if (it != slots_.end() && ++it->second.left == size()) slots_.erase(it);
}

namespace {

// Copies a matched message or fails both sides when the sizes disagree.
void deliver(std::byte* dst, std::int64_t dst_bytes, const std::byte* src, std::int64_t src_bytes,
             EventState& recv_done, EventState& send_done, const std::string& where) {
  if (dst_bytes != src_bytes) {
    auto error = std::make_exception_ptr(Error(
        ErrorKind::kInvalidArgument, fmt::format("{}: send of {} bytes matched a recv of {} bytes",
                                                 where, src_bytes, dst_bytes)));
    recv_done.fail(error);
    send_done.fail(error);
    return;
  }
  if (src_bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(src_bytes));
  recv_done.complete();
  send_done.complete();
}

}  // namespace

void Group::post_send(int src, int dst, int tag, const std::byte* data, std::int64_t bytes,
                      std::shared_ptr<EventState> done) {
  post(src, dst, tag, Pending{nullptr, data, bytes, std::move(done)}, /*sending=*/true);
}

void Group::post_recv(int src, int dst, int tag, std::byte* data, std::int64_t bytes,
                      std::shared_ptr<EventState> done) {
  post(src, dst, tag, Pending{data, nullptr, bytes, std::move(done)}, /*sending=*/false);
}

void Group::post(int src, int dst, int tag, Pending mine, bool sending) {
  if (auto f = world_.failure()) {
    mine.done->fail(std::make_exception_ptr(
        Error(ErrorKind::kCommunication, fmt::format("{} failed: {}", mine.done->what(), *f))));
    return;
  }
  std::unique_lock lock(mu_);
  Channel& ch = channels_[{src, dst, tag}];
  std::deque<Pending>& others = sending ? ch.recvs : ch.sends;
  if (others.empty()) {
    (sending ? ch.sends : ch.recvs).push_back(std::move(mine));
    return;
  }
  Pending other = std::move(others.front());
  others.pop_front();
  lock.unlock();
  const Pending& s = sending ? mine : other;
  const Pending& r = sending ? other : mine;
  deliver(
      r.recv_data, r.bytes, s.send_data, s.bytes, *r.done, *s.done,
      fmt::format("send from device {} to device {} tag {}", devices_[src], devices_[dst], tag));
}

void Group::abort_pending(std::exception_ptr error) {
  std::map<std::tuple<int, int, int>, Channel> channels;
  {
    std::lock_guard lock(mu_);
    channels.swap(channels_);
  }
  cv_.notify_all();
  for (auto& [key, ch] : channels) {
    for (auto& s : ch.sends) s.done->fail(error);
    for (auto& r : ch.recvs) r.done->fail(error);
  }
}

void Group::on_exit(DeviceId device) {
  std::vector<std::shared_ptr<EventState>> orphans;
  {
    std::lock_guard lock(mu_);
    for (auto& [key, ch] : channels_) {
      auto [src, dst, tag] = key;
      if (devices_[dst] == device) {
        for (auto& s : ch.sends) orphans.push_back(s.done);
        ch.sends.clear();
      }
      if (devices_[src] == device) {
        for (auto& r : ch.recvs) orphans.push_back(r.done);
        ch.recvs.clear();
      }
    }
  }
  cv_.notify_all();
  for (auto& e : orphans) {
    e->fail(std::make_exception_ptr(
        Error(ErrorKind::kCommunication,
              fmt::format("{} failed: device {} finished its program without matching it",
                          e->what(), device))));
  }
}

World::World(std::vector<DeviceId> devices, Timeout timeout)
    : devices_(std::move(devices)), timeout_(timeout), exited_(devices_.size()) {
  for (std::size_t i = 0; i < devices_.size(); ++i)
    index_.emplace(devices_[i], static_cast<int>(i));
  for (auto& e : exited_) e = false;
}

int World::index_of(DeviceId device) const {
  auto it = index_.find(device);
  MESHFLOW_CHECK(it != index_.end(), "device {} is not in this launch", device);
  return it->second;
}

std::shared_ptr<Group> World::group(const std::vector<DeviceId>& devices) {
  std::lock_guard lock(mu_);
  auto& g = groups_[devices];
  if (!g) g = std::make_shared<Group>(*this, devices);
  return g;
}

void World::mark_failed(DeviceId device, const std::string& what) {
  {
    std::lock_guard lock(mu_);
    if (!failed_device_) {
      failed_device_ = device;
      failure_ = fmt::format("device {} failed: {}", device, what);
    }
    failed_ = true;
  }
  wake_all(std::make_exception_ptr(Error(ErrorKind::kCommunication, *failure())));
}

void World::mark_exited(DeviceId device) {
  exited_[index_of(device)] = true;
  std::vector<std::shared_ptr<Group>> groups;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, g] : groups_) groups.push_back(g);
  }
  for (auto& g : groups) g->on_exit(device);
}

void World::wake_all(std::exception_ptr error) {
  std::vector<std::shared_ptr<Group>> groups;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, g] : groups_) groups.push_back(g);
  }
  for (auto& g : groups) g->abort_pending(error);
}

std::optional<std::string> World::failure() const {
  if (!failed_.load()) return std::nullopt;
  std::lock_guard lock(mu_);
  return failure_;
}

std::optional<DeviceId> World::first_failed() const {
  std::lock_guard lock(mu_);
  return failed_device_;
}

std::exception_ptr run_device(World& world, DeviceId device, const std::function<void()>& body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    world.mark_failed(device, e.what());
    return std::current_exception();
  } catch (...) {
    world.mark_failed(device, "unknown exception");
    return std::current_exception();
  }
}

}  // namespace meshflow::threads

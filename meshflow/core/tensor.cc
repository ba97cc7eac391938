// Tensor storage.
#include "meshflow/core/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "meshflow/core/limits.h"

namespace meshflow {

namespace {

// Buffers of at least kCacheMinBytes, once freed, are kept for the next allocation of the same
// rounded size, up to kCacheBytes in all (the oldest go first). A loop that allocates and frees
// same-sized tensors (an operator's result every step) then reuses memory already faulted in:
// malloc maps buffers from glibc's mmap threshold (128 KiB) up afresh on every allocation, and
// faulting in 16 MiB costs more than adding two 16 MiB tensors. Smaller buffers pay it too:
// `bench overlap` at 1 MiB on 2 devices (512 KiB blocks) ran 1.5-4x its sequential baseline when
// only buffers of 1 MiB and up were kept, 1.00-1.04x now. The cache is the process's, not a
// thread's: a device thread's result is often freed by another thread (the Python module frees
// every result on the interpreter's thread), and a per-thread cache then never hands it back.
// Only bytes bound it: the bench GPT on 4 device threads frees about 2,000 such buffers a step,
// up to about 200 of them waiting at once, and a cap of 64 buffers evicted them before their
// next use (1,300-3,700 page faults a step, a vocabulary-parallel loss gradient 5x its time).
constexpr std::size_t kCacheMinBytes = std::size_t{128} << 10;
constexpr std::size_t kCacheBytes = std::size_t{512} << 20;

class BufferCache {
 public:
  void* take(std::size_t n) {
    std::lock_guard lock(mu_);
    const auto [first, last] = by_size_.equal_range(n);
    if (first == last) return nullptr;
    const auto newest = std::prev(last);  // equal keys keep their insertion order
    void* p = newest->second->second;
    oldest_first_.erase(newest->second);
    by_size_.erase(newest);
    bytes_ -= n;
    return p;
  }
  // Returns true when the cache keeps p (else the caller frees it).
  bool keep(std::size_t n, void* p) {
    if (n < kCacheMinBytes || n > kCacheBytes) return false;
    std::vector<void*> evicted;
    {
      std::lock_guard lock(mu_);
      while (!oldest_first_.empty() && bytes_ + n > kCacheBytes) {
        const auto& [size, q] = oldest_first_.front();
        evicted.push_back(q);
        bytes_ -= size;
        // The oldest buffer of its size is the first of its equal range.
        by_size_.erase(by_size_.lower_bound(size));
        oldest_first_.pop_front();
      }
      oldest_first_.emplace_back(n, p);
      by_size_.emplace(n, std::prev(oldest_first_.end()));
      bytes_ += n;
    }
    for (void* q : evicted) std::free(q);  // outside the lock: unmapping is slow
    return true;
  }

 private:
  using Entry = std::pair<std::size_t, void*>;  // size, buffer
  std::mutex mu_;
  std::list<Entry> oldest_first_;
  std::multimap<std::size_t, std::list<Entry>::iterator> by_size_;
  std::size_t bytes_ = 0;
};

// Never destroyed: tensors freed during static destruction still find it.
BufferCache& buffer_cache() {
  static BufferCache* cache = new BufferCache;
  return *cache;
}

// Buffers of at least kHugeMinBytes start on a huge-page boundary and ask the kernel for
// transparent huge pages (as NumPy does for arrays of 4 MiB and more): first touching a fresh
// buffer then takes one fault per 2 MiB instead of one per 4 KiB. On the reference machine (a
// VM where a fault costs ~12 us) copying 256 MiB into fresh memory took 0.8 s with 4 KiB pages
// and 32 ms with huge pages. Where the kernel has them off, madvise fails and nothing changes.
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;  // x86-64 and arm64 (4 KiB base)
constexpr std::size_t kHugeMinBytes = std::size_t{4} << 20;

// Returns `bytes` of storage aligned for a tensor, or null when there is no memory.
void* allocate(std::size_t bytes) {
  const bool huge = bytes >= kHugeMinBytes;
  void* p = nullptr;
  if (::posix_memalign(&p, huge ? kHugePageBytes : kTensorAlignment, bytes) != 0) return nullptr;
  if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: a refusal is harmless
  return p;
}

}  // namespace

void Tensor::FreeAligned::operator()(std::byte* p) const {
  if (!buffer_cache().keep(bytes, p)) std::free(p);
}

Tensor::Tensor(DType dtype, Shape shape) : Tensor(dtype, std::move(shape), NoFill{}) {
  std::memset(data_.get(), 0, nbytes());
}

Tensor Tensor::reshaped(Tensor&& t, Shape shape) {
  const std::int64_t n = checked_numel(shape, t.dtype_, "tensor shape");
  if (n != t.numel_) {
    fail(ErrorKind::kShapeMismatch, "reshape of {} elements {} to {}", t.numel_,
         to_string(t.shape_), to_string(shape));
  }
  Tensor out = std::move(t);
  out.shape_ = std::move(shape);
  t = Tensor();
  return out;
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  return Tensor(dtype, std::move(shape), NoFill{});
}

Tensor::Tensor(DType dtype, Shape shape, NoFill) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel(shape_, dtype_, "tensor shape");
  // Always allocate at least one aligned block so data pointers are never null.
  std::size_t bytes = nbytes();
  std::size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded == 0) rounded = kTensorAlignment;
  void* p = rounded >= kCacheMinBytes ? buffer_cache().take(rounded) : nullptr;
  if (p == nullptr) p = allocate(rounded);
  if (p == nullptr) throw std::bad_alloc();
  data_ =
      std::unique_ptr<std::byte[], FreeAligned>(static_cast<std::byte*>(p), FreeAligned{rounded});
}

Tensor Tensor::clone() const {
  Tensor out = uninitialized(dtype_, shape_);
  std::memcpy(out.bytes(), bytes(), nbytes());
  return out;
}

void Tensor::check_dtype(DType requested) const {
  if (requested != dtype_) {
    fail(ErrorKind::kInvalidArgument, "tensor holds {} but was read as {}", to_string(dtype_),
         to_string(requested));
  }
}

}  // namespace meshflow

// backends/cpu/spare_pool.hpp — the kernels' working memory: blocks a thread
// keeps from one call for its next (SparePool, Buffer), so that a call does
// not fault its pages in afresh — the copies of a widened call (widen.hpp) and
// the tiled kernels' large tiles (tiled.hpp) — and vectors on 64-byte lines
// (LineVector) for the bfloat16 unit's operands (docs/PERFORMANCE.md, "The
// 16-bit calls' copies" and "The stencil in d, and the unit's operands on cache
// lines").
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "isa.hpp"

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {

/// The blocks a thread's finished calls left for its next ones: the copies
/// of a widened call (widen.hpp) and the tiled kernels' large tiles
/// (tiled.hpp) are taken from here, not faulted in afresh (page faults were
/// 8 ms, 15 %, of a 52 ms causal bfloat16 forward at 2048 tokens, 8 heads,
/// head_dim 64: docs/PERFORMANCE.md). At most kSpareBytes per thread
/// and type W are kept (per instruction set too, this being in its
/// namespace); a returned block is kept and the smallest kept ones make room,
/// and a block larger than kSpareBytes goes back to the system, where its
/// faults cost little beside the O(n²d) work of the call that needed it. Each
/// thread has its own pool (thread_local), freed when the thread ends.
/// Every block starts on a 64-byte line (kAlign), so that rows of whole lines
/// in it (the bfloat16 weights W̃ that the AMX tile loads read) never split
/// one (docs/PERFORMANCE.md, "The stencil in d, and the unit's operands on cache
/// lines").
template <class W>
class SparePool {
  static_assert(std::is_trivially_default_constructible<W>::value && std::is_trivially_destructible<W>::value,
                "blocks are raw storage");

 public:
  static constexpr std::size_t kSpareBytes = std::size_t(64) << 20;
  static constexpr std::size_t kAlign = 64;
  struct Free {
    void operator()(W* p) const noexcept { ::operator delete[](p, std::align_val_t(kAlign)); }
  };
  struct Block {
    std::unique_ptr<W[], Free> p;
    std::size_t n = 0;
  };
  static SparePool& local() {
    thread_local SparePool pool;
    return pool;
  }
  /// The smallest kept block of at least n elements, or a new one.
  Block take(std::size_t n) {
    std::size_t best = blocks_.size();
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].n >= n && (best == blocks_.size() || blocks_[i].n < blocks_[best].n)) best = i;
    if (best == blocks_.size())  // W is trivial (float, double, long double, uint16_t): no constructors run
      return Block{std::unique_ptr<W[], Free>(static_cast<W*>(::operator new[](n * sizeof(W), std::align_val_t(kAlign)))),
                   n};
    Block b = std::move(blocks_[best]);
    blocks_.erase(blocks_.begin() + std::ptrdiff_t(best));
    bytes_ -= b.n * sizeof(W);
    return b;
  }
  /// Keeps b for a later call if it fits, dropping the smallest kept blocks
  /// to make room; b is freed instead if it cannot be kept (too large, or no
  /// memory to list it).
  void give(Block b) noexcept {
    const std::size_t size = b.n * sizeof(W);
    if (!b.p || size > kSpareBytes) return;
    while (!blocks_.empty() && bytes_ + size > kSpareBytes) {
      auto smallest = std::min_element(blocks_.begin(), blocks_.end(),
                                       [](const Block& x, const Block& y) { return x.n < y.n; });
      bytes_ -= smallest->n * sizeof(W);
      blocks_.erase(smallest);
    }
    try {
      blocks_.push_back(std::move(b));  // strong guarantee: on bad_alloc b still owns (and frees) its block
      bytes_ += size;
    } catch (...) {
    }
  }

 private:
  std::vector<Block> blocks_;
  std::size_t bytes_ = 0;
};

/// Storage for n W's from the calling thread's SparePool, left
/// uninitialised: every element is written before it is read (a new block's
/// pages are first touched by the thread that writes them, not in a serial
/// fill). Given back to the pool of the thread that destroys it, which must
/// be the one that allocated it (a thread's own workspace, or the caller's).
template <class W>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : b_(std::move(o.b_)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      if (b_.p) SparePool<W>::local().give(std::move(b_));
      b_ = std::move(o.b_);
    }
    return *this;
  }
  ~Buffer() {
    if (b_.p) SparePool<W>::local().give(std::move(b_));
  }
  W* allocate(std::size_t n) {
    if (b_.p) SparePool<W>::local().give(std::move(b_));
    b_ = n ? SparePool<W>::local().take(n) : typename SparePool<W>::Block{};
    return b_.p.get();
  }
  W* data() const { return b_.p.get(); }

 private:
  typename SparePool<W>::Block b_;
};

/// An allocator of storage on 64-byte lines (not pooled), for the tile
/// operands that grow per task (LineVector): rows of whole lines in them never
/// split one.
template <class T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const LineAllocator<U>&) const noexcept { return false; }
};
template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum

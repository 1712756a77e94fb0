// tests/cuda/emulate.hpp — runs the CUDA backend's kernel bodies on the host.
//
// The bodies in backends/cuda/{forward,backward}.cuh use only six accessors
// (thread id, block size, block id, grid size, block barrier, dynamic shared
// memory). Here a "block" is `threads` host threads sharing one buffer and a
// barrier; the blocks of a launch run one after another. That executes the
// kernels' real index arithmetic, tiling, halos and barriers on a machine
// without a GPU. It does not model warps, memory coalescing or fp contraction
// (nvcc fuses a*b+c into FMA; g++ here does not), so results agree with the GPU
// within rounding, not bitwise.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define CONTINUUM_CUDA_EMULATE 1
#include <continuum/attention/params.hpp>

namespace continuum {
namespace cuda_detail {
namespace emu {

/// A reusable barrier (generation counter), for block_sync().
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const long gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  long gen_ = 0;
};

struct State {
  int threads = 1;
  index_t grid = 1;
  std::vector<unsigned char> shared;
  Barrier* barrier = nullptr;
};
inline State& state() {
  static State s;
  return s;
}
inline thread_local int tl_thread = 0;
inline thread_local index_t tl_block = 0;

}  // namespace emu

inline int thread_id() { return emu::tl_thread; }
inline int block_threads() { return emu::state().threads; }
inline index_t block_id() { return emu::tl_block; }
inline index_t grid_blocks() { return emu::state().grid; }
inline void block_sync() { emu::state().barrier->wait(); }
inline unsigned char* shared_bytes() { return emu::state().shared.data(); }

/// Runs `body` as a launch of `grid` blocks of `threads` threads with
/// `shared_bytes` of dynamic shared memory (filled with a NaN pattern first,
/// so that a read of an unwritten tile shows up in the results).
inline void emulate_launch(index_t grid, int threads, std::size_t shared_bytes,
                           const std::function<void()>& body) {
  emu::State& s = emu::state();
  s.threads = threads;
  s.grid = grid;
  s.shared.assign(shared_bytes, 0xFF);  // 0xFFFFFFFF is a NaN in float; exact size: ASan sees overruns
  emu::Barrier barrier(threads);
  s.barrier = &barrier;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      emu::tl_thread = t;
      for (index_t blk = 0; blk < grid; ++blk) {
        emu::tl_block = blk;
        body();
        barrier.wait();  // blocks run one after another
      }
    });
  }
  for (auto& th : pool) th.join();
  s.barrier = nullptr;
}

}  // namespace cuda_detail
}  // namespace continuum

#include <continuum/backends/cuda/backward.cuh>
#include <continuum/backends/cuda/forward.cuh>

// bench_attention.cpp — Google Benchmark suite for the CPU operator.
//
// What it measures, all in one run so that ratios are taken side by side:
//   * peak_fma/<float|double>/threads  — a register-resident FMA loop with enough
//     independent accumulators to saturate the FMA pipes, at the vector width
//     of the instruction set the kernels run (context "isa": chosen at run
//     time, cpu_dispatch): the machine's practical peak for them.
//   * eigen_gemm/...    — the two GEMMs of attention (S = Q·Kᵀ, O = S·V) with
//     Eigen, per head, heads spread over the threads: the FLOP floor of an
//     unfused implementation.
//   * eigen_materialized/... — plain Eigen attention (GEMM, row softmax, GEMM)
//     with the n×n matrix materialised: the textbook baseline.
//   * attention/<kernel>/<visibility>/<fwd|fwdbwd>/<type>/n/threads — the
//     operator (continuum, softmax, focal), forward or forward + backward (the
//     forward keeping its row statistics for the backward, as training does).
//   * decode/<kernel>/gqa8x2/f32/kv/d/threads — one KV-cache decode step (one
//     query row per head, 8 query heads on 2 KV heads, kv cached keys), with
//     "bytes/s" of the K/V cache it reads and "frac_bw" = that over
//     read_bandwidth (a 1 GiB read probe of the same run): its roofline.
//
// FLOP convention (flash-attention's benchmark): the forward costs 4·d per
// visible (query, key) pair (2·d for q·k, 2·d for p·v; Dv = d), i.e. 4·n²·d per
// head without a mask and about half of it causal (we count the exact number
// of visible pairs); the backward costs 2.5× the forward, so fwd+bwd = 3.5×.
// The stencil of continuum attention (moments, exps) is *not* counted: the
// FLOP rate is "useful GEMM work per second", comparable across kernels.
// Bytes: every input and output tensor touched once (Q, K, V, O, lse; plus dO,
// dQ, dK, dV for the backward) — a lower bound of the memory traffic.
// Counters: "FLOP/s", "bytes/s" and "frac_peak" (FLOP/s ÷ the peak_fma probe
// of the same type and thread count, measured at start-up of this process).
//
// Inputs: uniform in [-1, 1], fixed seed (42); batch 1, 8 heads, head_dim 64
// unless the name says otherwise. Wall-clock time (UseRealTime) since the
// operator runs OpenMP threads.
//
// Extra mode: `bench_attention --memory_probe N D [float64]` runs one
// causal continuum forward and one backward at batch 1, 8 heads, Lq = Lk = N,
// head_dim D, 2 threads (float storage; float arithmetic, or
// Compute::float64 when the fourth argument says float64), and
// prints the peak-RSS growth (getrusage) beyond the allocated tensors, in MiB,
// as JSON on stdout.
#include <benchmark/benchmark.h>

#include <Eigen/Dense>
#include <continuum/continuum.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#  include <immintrin.h>
#endif

#if defined(_OPENMP)
#  include <omp.h>
#endif

namespace {

// ---------------------------------------------------------------------------
// Machine-peak probe.
// ---------------------------------------------------------------------------
/// The instruction set the operator's kernels run: chosen at run time from
/// the CPU (cpu_dispatch, the project's build) or fixed by -march (a
/// header-only build of this file).
const char* kernel_isa() {
#if defined(CONTINUUM_CPU_DISPATCH)
  return continuum::cpu_dispatch::name(continuum::cpu_dispatch::selected());
#else
  return continuum::cpu_detail::kCompiledIsa;
#endif
}

/// The CPU's model name with its family, model and stepping numbers
/// (/proc/cpuinfo; a virtual machine's name alone, "AMD EPYC", does not tell
/// Zen 4 from Zen 5), or "unknown".
std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return "unknown";
  char line[512];
  std::string name, family, model, stepping;
  const auto value = [&line] {
    const char* colon = std::strchr(line, ':');
    std::string v = colon != nullptr ? colon + 1 : "";
    v.erase(0, v.find_first_not_of(' '));
    v.erase(v.find_last_not_of("\n ") + 1);
    return v;
  };
  while (std::fgets(line, sizeof line, f) != nullptr && line[0] != '\n') {  // the first processor only
    if (std::strncmp(line, "model name", 10) == 0) name = value();
    else if (std::strncmp(line, "cpu family", 10) == 0) family = value();
    else if (std::strncmp(line, "model\t", 6) == 0 || std::strncmp(line, "model ", 6) == 0) model = value();
    else if (std::strncmp(line, "stepping", 8) == 0) stepping = value();
  }
  std::fclose(f);
  if (name.empty()) return "unknown";
  if (!family.empty()) name += " (family " + family + ", model " + model + ", stepping " + stepping + ")";
  return name;
}

/// Runs `iters` rounds of kAcc independent FMA chains on full vectors of
/// VecBytes and returns the number of floating-point operations done (2 per
/// lane per FMA). Every chain must stay in a register: a chain spilled to the
/// stack adds a store and a reload to its latency. AVX-512 has 32 vector
/// registers: 16 accumulators. AVX2 and SSE have 16, which must also hold x
/// and y: 12 accumulators, still 1.5× the 8 chains that hide a 4-cycle FMA
/// latency on 2 pipes. (16 on AVX2 spilled 3 of them, and the loop measured
/// 57 % of an AMD Zen 3's FMA peak.)
template <class T, int VecBytes>
__attribute__((always_inline)) inline double fma_loop(long iters, T seed) {
  typedef T V __attribute__((vector_size(VecBytes)));
  constexpr int kAcc = VecBytes == 64 ? 16 : 12;
  constexpr int kLanes = VecBytes / int(sizeof(T));
  V acc[kAcc];
  V x, y;
  for (int l = 0; l < kLanes; ++l) {
    x[l] = T(1) + seed * T(1e-7);
    y[l] = T(1e-7);
  }
  for (int a = 0; a < kAcc; ++a)
    for (int l = 0; l < kLanes; ++l) acc[a][l] = seed * T(a);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int a = 0; a < kAcc; ++a) acc[a] = acc[a] * x + y;
    asm volatile("" : "+x"(x));  // keep the loop from being folded
  }
  T sink = 0;
  for (int a = 0; a < kAcc; ++a)
    for (int l = 0; l < kLanes; ++l) sink += acc[a][l];
  benchmark::DoNotOptimize(sink);
  return 2.0 * double(kAcc) * double(kLanes) * double(iters);
}

// The loop compiled for each instruction set the kernels can run (cpu_dispatch),
// whatever this file's own -march: the peak is that of the set that ran.
template <class T>
__attribute__((noinline)) double fma_128(long iters, T seed) { return fma_loop<T, 16>(iters, seed); }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
template <class T>
__attribute__((noinline, target("avx2,fma"))) double fma_256(long iters, T seed) {
  return fma_loop<T, 32>(iters, seed);
}
template <class T>
__attribute__((noinline, target("avx512f"))) double fma_512(long iters, T seed) {
  return fma_loop<T, 64>(iters, seed);
}
#endif

/// The FMA loop at the vector width of the kernels' instruction set.
template <class T>
double fma_kernel(long iters, T seed) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const std::string isa = kernel_isa();
  if (isa == "avx512" || isa == "avx512bf16" || isa == "amx") return fma_512<T>(iters, seed);
  if (isa == "avx2" || isa == "avx+fma") return fma_256<T>(iters, seed);
#endif
  return fma_128<T>(iters, seed);
}

/// FLOP/s of `loop` (returning the FLOPs it did) run on `threads` threads at
/// once, best of three trials of ~50 ms (long enough that waking the OpenMP
/// team does not count).
template <class Loop>
double best_rate(int threads, Loop&& loop) {
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const auto t0 = std::chrono::steady_clock::now();
    double flops = 0;
#if defined(_OPENMP)
#  pragma omp parallel num_threads(threads) reduction(+ : flops)
#endif
    flops += loop();
    const double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / dt);
  }
  return best;
}

/// Peak FLOP/s of the kernels' FMA unit with `threads` threads.
template <class T>
double measure_peak(int threads) {
  return best_rate(threads, [] { return fma_kernel<T>(12'000'000, T(1)); });
}

/// The AMX-BF16 tile peak: four independent tdpbf16ps chains (16 × 16 × 32
/// multiply-adds each) on register-resident tiles, per thread; the FLOPs done.
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#  define BENCH_AMX 1
__attribute__((noinline, target("amx-tile,amx-bf16"))) double amx_loop(long iters) {
  struct alignas(64) Config {
    unsigned char palette, start;
    unsigned char reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
  };
  static const Config cfg = [] {
    Config c{};
    c.palette = 1;
    for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
    return c;
  }();
  alignas(64) static const unsigned short ab[16 * 32] = {0x3c00};  // bfloat16 bits; mostly zero
  asm volatile("" ::: "memory");
  _tile_loadconfig(&cfg);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  benchmark::DoNotOptimize(out[0]);
  return 4.0 * 2.0 * 16 * 16 * 32 * double(iters);
}
#endif

/// The AVX512-BF16 peak: 16 independent vdpbf16ps chains (16 lanes × 2
/// multiply-adds each) on register-resident vectors, per thread; the FLOPs done.
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#  define BENCH_AVX512BF16 1
__attribute__((noinline, target("avx512f,avx512bf16"))) double dpbf16_loop(long iters) {
  constexpr int kAcc = 16;
  __m512 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_set1_ps(float(a));
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (long i = 0; i < iters; ++i) {
#  pragma GCC unroll 16
    for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_dpbf16_ps(acc[a], x, y);
    asm volatile("" : "+v"(x));  // keep the loop from being folded
  }
  float sink = 0;
  for (int a = 0; a < kAcc; ++a) sink += _mm512_reduce_add_ps(acc[a]);
  benchmark::DoNotOptimize(sink);
  return 2.0 * 2.0 * 16 * kAcc * double(iters);
}
#endif

/// The peak of the unit that runs bfloat16 products: AMX tiles when the
/// kernels are "amx", AVX512-BF16 vectors when they are "avx512bf16" (best of
/// three ~50 ms trials), else float FMA (the vector path converts bfloat16
/// to float).
double measure_peak_bf16(int threads) {
#if defined(BENCH_AMX)
  if (std::string(kernel_isa()) == "amx") return best_rate(threads, [] { return amx_loop(2'000'000); });
#endif
#if defined(BENCH_AVX512BF16)
  if (std::string(kernel_isa()) == "avx512bf16")
    return best_rate(threads, [] { return dpbf16_loop(6'000'000); });
#endif
  return measure_peak<float>(threads);
}

/// The unit bfloat16 products run on: "amx-bf16 tiles", "avx512-bf16
/// vectors" or "float FMA, <isa>".
std::string bf16_unit() {
  const std::string isa = kernel_isa();
  if (isa == "amx") return "amx-bf16 tiles";
  if (isa == "avx512bf16") return "avx512-bf16 vectors";
  return "float FMA, " + isa;
}

/// Peaks measured once at start-up, keyed by (bytes of T, threads).
std::map<std::pair<int, int>, double>& peaks() {
  static std::map<std::pair<int, int>, double> p;
  return p;
}
template <class T>
double peak(int threads) {
  auto& p = peaks();
  // float16's products run in float FMA: float's peak (its own key, 3).
  const auto key = std::make_pair(std::is_same<T, continuum::float16>::value ? 3 : int(sizeof(T)), threads);
  auto it = p.find(key);
  if (it == p.end()) {
    if constexpr (std::is_same<T, continuum::bfloat16>::value)
      it = p.emplace(key, measure_peak_bf16(threads)).first;
    else if constexpr (std::is_same<T, continuum::float16>::value)
      it = p.emplace(key, measure_peak<float>(threads)).first;
    else
      it = p.emplace(key, measure_peak<T>(threads)).first;
  }
  return it->second;
}

template <class T>
void BM_peak_fma(benchmark::State& st) {
  const int threads = int(st.range(0));
  const long iters = 200'000;
  double flops = 0;
  for (auto _ : st) {
    double f = 0;
#if defined(_OPENMP)
#  pragma omp parallel num_threads(threads) reduction(+ : f)
#endif
    f += fma_kernel<T>(iters, T(1));
    flops = f;
  }
  st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["frac_peak"] =
      benchmark::Counter(flops / peak<T>(threads), benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(kernel_isa());
}

// ---------------------------------------------------------------------------
// Inputs and counters.
// ---------------------------------------------------------------------------
constexpr int kBatch = 1;
constexpr int kHeads = 8;

template <class T>
std::vector<T> uniform(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = T(float(u(rng)));
  return v;
}

enum class Vis { full, causal, window };
constexpr long kWindow = 256;

/// Exact number of visible (query, key) pairs per head, Lq = Lk = n.
double visible_pairs(long n, Vis vis) {
  switch (vis) {
    case Vis::full: return double(n) * double(n);
    case Vis::causal: return double(n) * double(n + 1) / 2;
    case Vis::window: {
      double s = 0;
      for (long i = 0; i < n; ++i) s += double(std::min(i + 1, kWindow));
      return s;
    }
  }
  return 0;
}

/// All tensors of one benchmark case (BHSD, contiguous).
template <class T>
struct Problem {
  long n, d;
  std::vector<T> q, k, v, o, dout, dq, dk, dv;
  std::vector<continuum::accum_t<T>> lse;
  // The forward's row statistics for the backward (params.hpp RowStats), as
  // a training step keeps them: asked for by the forward of a fwdbwd run.
  std::vector<continuum::accum_t<T>> stats;
  std::vector<continuum::index_t> stats_ref;
  Problem(long n_, long d_, bool backward) : n(n_), d(d_) {
    const std::size_t sz = std::size_t(kBatch) * kHeads * n * d;
    q = uniform<T>(sz, 42);
    k = uniform<T>(sz, 43);
    v = uniform<T>(sz, 44);
    o.assign(sz, T(0));
    lse.assign(std::size_t(kBatch) * kHeads * n, 0);
    if (backward) {
      dout = uniform<T>(sz, 45);
      stats.assign(std::size_t(kBatch) * kHeads * n * continuum::row_stats_width(d), 0);
      stats_ref.assign(std::size_t(kBatch) * kHeads * n, 0);
      dq.assign(sz, T(0));
      dk.assign(sz, T(0));
      dv.assign(sz, T(0));
    }
  }
  continuum::TensorView<T> view(std::vector<T>& x) {
    return continuum::TensorView<T>::bhsd(x.data(), kBatch, kHeads, n, d);
  }
  continuum::TensorView<const T> cview(std::vector<T>& x) { return view(x); }
};

continuum::Visibility make_visibility(Vis vis) {
  continuum::Visibility v;
  v.causal = vis != Vis::full;
  v.window_left = vis == Vis::window ? kWindow - 1 : -1;  // causal, kWindow keys
  return v;
}

const char* vis_name(Vis v) {
  return v == Vis::full ? "full" : v == Vis::causal ? "causal" : "window";
}

/// The backward's arguments for a forward call `fa` on problem p: same inputs,
/// kernel, temperature, visibility, threads and arithmetic; gradients into p.
template <class T>
continuum::BackwardArgs<T> backward_args(const continuum::ForwardArgs<T>& fa, Problem<T>& p) {
  continuum::BackwardArgs<T> ba;
  ba.query = fa.query;
  ba.key = fa.key;
  ba.value = fa.value;
  ba.out = p.cview(p.o);
  ba.grad_out = p.cview(p.dout);
  ba.lse = p.lse.data();
  ba.grad_query = p.view(p.dq);
  ba.grad_key = p.view(p.dk);
  ba.grad_value = p.view(p.dv);
  static_cast<continuum::AttentionOptions<T>&>(ba) = fa;  // the forward's options
  ba.row_stats = fa.row_stats;
  return ba;
}

template <class T>
void set_counters(benchmark::State& st, double flops, double bytes, int threads) {
  st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["frac_peak"] =
      benchmark::Counter(flops / peak<T>(threads), benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------
// The operator.
// ---------------------------------------------------------------------------
template <class T>
void BM_attention(benchmark::State& st, continuum::Kernel kernel, Vis vis, bool backward, bool float_arith /* false: Compute::float64 */) {
  const long n = st.range(0);
  const long d = st.range(1);
  const int threads = int(st.range(2));
  Problem<T> p(n, d, backward);

  continuum::ForwardArgs<T> fa;
  fa.query = p.cview(p.q);
  fa.key = p.cview(p.k);
  fa.value = p.cview(p.v);
  fa.out = p.view(p.o);
  fa.lse = p.lse.data();
  fa.kernel = kernel;
  // focal at the operator level is softmax at a fixed temperature t < 1 (MATH.md §8);
  // 0.4 is the focal paper's best. The paper runs every method at τ = 0.3; the
  // cost does not depend on τ, so the other kernels keep τ = 1.
  if (kernel == continuum::Kernel::focal) fa.temperature.value = continuum::accum_t<T>(0.4);
  fa.visibility = make_visibility(vis);
  fa.num_threads = threads;
  fa.compute = float_arith ? continuum::Compute::automatic : continuum::Compute::float64;
  if (backward) fa.row_stats = {p.stats.data(), p.stats_ref.data()};

  const continuum::BackwardArgs<T> ba = backward ? backward_args(fa, p) : continuum::BackwardArgs<T>{};

  continuum::attention_forward(continuum::cpu, fa);  // warm-up
  for (auto _ : st) {
    continuum::attention_forward(continuum::cpu, fa);
    if (backward) continuum::attention_backward(continuum::cpu, ba);
    benchmark::DoNotOptimize(p.o.data());
    benchmark::ClobberMemory();
  }
  const double heads = double(kBatch) * kHeads;
  const double fwd_flops = 4.0 * double(d) * visible_pairs(n, vis) * heads;
  const double flops = backward ? 3.5 * fwd_flops : fwd_flops;
  const double tensor = heads * double(n) * double(d) * sizeof(T);
  const double fwd_bytes = 4 * tensor + heads * double(n) * sizeof(T);
  const double bytes = backward ? fwd_bytes + 8 * tensor + heads * double(n) * sizeof(T) : fwd_bytes;
  set_counters<T>(st, flops, bytes, threads);
}

// ---------------------------------------------------------------------------
// Decoding: one query row per head against a KV cache (GQA), and the memory
// bandwidth that bounds it.
// ---------------------------------------------------------------------------
constexpr int kDecodeKvHeads = 2;  // 8 query heads on 2 KV heads

/// Read bandwidth: `threads` threads sum disjoint halves of a 1 GiB float
/// buffer (far beyond the caches), vectorised, in bytes/s ("bytes/s"). The
/// decode rows' "frac_bw" is their K/V bytes/s over the median of this probe
/// measured at start-up.
double read_bandwidth_once(const std::vector<float>& buf, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  double total = 0;
  const long n = long(buf.size());
#if defined(_OPENMP)
#  pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
#endif
  for (long c = 0; c < 64; ++c) {
    const float* p = buf.data() + c * (n / 64);
    float acc[16] = {};
    for (long i = 0; i < n / 64; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += p[i + l];
    for (float a : acc) total += a;
  }
  benchmark::DoNotOptimize(total);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(buf.size()) * sizeof(float) / dt;
}
std::vector<float>& bandwidth_buffer() {
  static std::vector<float> buf(std::size_t(1) << 28, 1.0f);  // 1 GiB
  return buf;
}
double read_bandwidth(int threads) {
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  std::vector<double> v;
  for (int r = 0; r < 5; ++r) v.push_back(read_bandwidth_once(bandwidth_buffer(), threads));
  std::sort(v.begin(), v.end());
  return cache[threads] = v[v.size() / 2];
}

void BM_read_bandwidth(benchmark::State& st) {
  const int threads = int(st.range(0));
  const auto& buf = bandwidth_buffer();
  for (auto _ : st) benchmark::DoNotOptimize(read_bandwidth_once(buf, threads));
  st.counters["bytes/s"] = benchmark::Counter(double(buf.size()) * sizeof(float),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

/// One decode step: B = 1, 8 query heads on 2 KV heads, Lq = 1, Lk cached keys
/// (all visible: causal, bottom-right), head_dim 64, storage T (float, or a
/// 16-bit KV cache: bfloat16, float16). The counters count the K and V cache
/// bytes the step must read, sizeof(T) each.
template <class T>
void BM_decode(benchmark::State& st, continuum::Kernel kernel) {
  const long lk = st.range(0), d = st.range(1);
  const int threads = int(st.range(2));
  const long hk = kDecodeKvHeads;
  std::vector<T> q = uniform<T>(std::size_t(kHeads * d), 42);
  std::vector<T> k = uniform<T>(std::size_t(hk * lk * d), 43);
  std::vector<T> v = uniform<T>(std::size_t(hk * lk * d), 44);
  std::vector<T> o(std::size_t(kHeads * d));
  std::vector<continuum::accum_t<T>> lse(kHeads);
  continuum::ForwardArgs<T> fa;
  fa.query = continuum::TensorView<const T>::bhsd(q.data(), 1, kHeads, 1, d);
  fa.key = continuum::TensorView<const T>::bhsd(k.data(), 1, hk, lk, d);
  fa.value = continuum::TensorView<const T>::bhsd(v.data(), 1, hk, lk, d);
  fa.out = continuum::TensorView<T>::bhsd(o.data(), 1, kHeads, 1, d);
  fa.lse = lse.data();
  fa.kernel = kernel;
  fa.visibility.causal = true;
  fa.num_threads = threads;
  continuum::attention_forward(continuum::cpu, fa);  // warm-up
  for (auto _ : st) {
    continuum::attention_forward(continuum::cpu, fa);
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  const double kv_bytes = 2.0 * double(hk) * double(lk) * double(d) * sizeof(T);
  st.counters["bytes/s"] = benchmark::Counter(kv_bytes, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["frac_bw"] =
      benchmark::Counter(kv_bytes / read_bandwidth(threads), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["FLOP/s"] = benchmark::Counter(4.0 * double(d) * double(lk) * kHeads,
                                             benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(kernel_isa());
}

// ---------------------------------------------------------------------------
// Eigen baselines at the same shapes.
// ---------------------------------------------------------------------------
template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// materialize = false: the two GEMMs only (S = Q·Kᵀ·c, O = S·V);
/// true: plain attention with a materialised n×n matrix and a row softmax.
template <class T>
void BM_eigen(benchmark::State& st, bool materialize) {
  const long n = st.range(0);
  const long d = st.range(1);
  const int threads = int(st.range(2));
  Problem<T> p(n, d, false);
  const T c = T(1) / std::sqrt(T(d));
  Eigen::setNbThreads(1);  // parallel over heads instead, like the operator
  std::vector<RowMat<T>> scratch(std::size_t(kBatch) * kHeads, RowMat<T>(n, n));
  for (auto _ : st) {
#if defined(_OPENMP)
#  pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int h = 0; h < kBatch * kHeads; ++h) {
      const std::size_t off = std::size_t(h) * n * d;
      Eigen::Map<const RowMat<T>> Q(p.q.data() + off, n, d), K(p.k.data() + off, n, d),
          V(p.v.data() + off, n, d);
      Eigen::Map<RowMat<T>> O(p.o.data() + off, n, d);
      RowMat<T>& S = scratch[std::size_t(h)];
      S.noalias() = (Q * c) * K.transpose();
      if (materialize) {
        for (long i = 0; i < n; ++i) {
          auto row = S.row(i).array();
          const T m = row.maxCoeff();
          row = (row - m).exp();
          row /= row.sum();
        }
      }
      O.noalias() = S * V;
    }
    benchmark::DoNotOptimize(p.o.data());
    benchmark::ClobberMemory();
  }
  const double heads = double(kBatch) * kHeads;
  const double flops = 4.0 * double(d) * double(n) * double(n) * heads;
  const double bytes = heads * (4.0 * double(n) * double(d) + 2.0 * double(n) * double(n)) * sizeof(T);
  set_counters<T>(st, flops, bytes, threads);
}

// ---------------------------------------------------------------------------
// Registration.
// ---------------------------------------------------------------------------
template <class T>
const char* type_name() {
  return std::is_same<T, continuum::float16>::value ? "f16" : sizeof(T) == 2 ? "bf16" : sizeof(T) == 4 ? "f32" : "f64";
}

void register_all() {
  using continuum::Kernel;
  const std::vector<Kernel> kernels = {Kernel::continuum, Kernel::softmax, Kernel::focal};
  const std::vector<Vis> visibilities = {Vis::full, Vis::causal, Vis::window};
  const long N = 2048, D = 64;

  for (int th : {1, 2}) {
    benchmark::RegisterBenchmark((std::string("peak_fma/f32/threads:") + std::to_string(th)).c_str(),
                                 BM_peak_fma<float>)->Arg(th)->UseRealTime();
    benchmark::RegisterBenchmark((std::string("peak_fma/f64/threads:") + std::to_string(th)).c_str(),
                                 BM_peak_fma<double>)->Arg(th)->UseRealTime();
  }
  for (int th : {1, 2})
    benchmark::RegisterBenchmark((std::string("read_bandwidth/threads:") + std::to_string(th)).c_str(),
                                 BM_read_bandwidth)->Arg(th)->UseRealTime();
  for (int th : {1, 2})
    for (long lk : {4096L, 32768L})
      for (Kernel kern : {Kernel::continuum, Kernel::softmax})
        benchmark::RegisterBenchmark((std::string("decode/") + (kern == Kernel::continuum ? "continuum" : "softmax") +
                                      "/gqa8x2/f32").c_str(), BM_decode<float>, kern)
            ->Args({lk, D, th})->ArgNames({"kv", "d", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
  // 16-bit KV caches (bfloat16, float16): continuum, 2 threads. The call
  // converts the cache to float (backends/cpu/widen.hpp), so these rows show
  // what that copy costs beside the f32 rows.
  for (long lk : {4096L, 32768L}) {
    benchmark::RegisterBenchmark("decode/continuum/gqa8x2/bf16", BM_decode<continuum::bfloat16>, Kernel::continuum)
        ->Args({lk, D, 2})->ArgNames({"kv", "d", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("decode/continuum/gqa8x2/f16", BM_decode<continuum::float16>, Kernel::continuum)
        ->Args({lk, D, 2})->ArgNames({"kv", "d", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  auto shape = [](benchmark::internal::Benchmark* b, long n, long d, int th) {
    b->Args({n, d, th})->ArgNames({"n", "d", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
  };
  // Eigen baselines, f32 and f64, 1 and 2 threads.
  for (int th : {1, 2}) {
    shape(benchmark::RegisterBenchmark("eigen_gemm/f32", BM_eigen<float>, false), N, D, th);
    shape(benchmark::RegisterBenchmark("eigen_materialized/f32", BM_eigen<float>, true), N, D, th);
  }
  shape(benchmark::RegisterBenchmark("eigen_gemm/f64", BM_eigen<double>, false), N, D, 2);

  // The operator, float storage. "f32" (the default, Compute::automatic:
  // float arithmetic): every kernel × visibility × {fwd, fwd+bwd}, 2 threads,
  // and 1 thread for continuum and softmax, full (thread scaling). "f32c64"
  // (Compute::float64: the same kernels in double, one rounding per output):
  // continuum and softmax, full and causal, 2 threads.
  for (bool fa : {true, false})
    for (bool bwd : {false, true})
      for (Kernel k : kernels)
        for (Vis v : visibilities)
          for (int th : {2, 1}) {
            if (th == 1 && (k == Kernel::focal || v != Vis::full)) continue;
            if (!fa && (th == 1 || k == Kernel::focal || v == Vis::window)) continue;
            const std::string name = std::string("attention/") + continuum::kernel_name(k) + "/" + vis_name(v) +
                                     (bwd ? "/fwdbwd" : "/fwd") + (fa ? "/f32" : "/f32c64");
            shape(benchmark::RegisterBenchmark(name.c_str(), BM_attention<float>, k, v, bwd, fa), N, D, th);
          }
  // f64: continuum and softmax, full and causal, 2 threads (double storage
  // computes in double).
  for (bool bwd : {false, true})
    for (Kernel k : {Kernel::continuum, Kernel::softmax})
      for (Vis v : {Vis::full, Vis::causal}) {
        const std::string name = std::string("attention/") + continuum::kernel_name(k) + "/" +
                                 vis_name(v) + (bwd ? "/fwdbwd" : "/fwd") + "/f64";
        shape(benchmark::RegisterBenchmark(name.c_str(), BM_attention<double>, k, v, bwd, true), N, D, 2);
      }
  // bfloat16 storage (float accumulation; products on the bfloat16 unit where "amx" or "avx512bf16" runs):
  // every kernel, full and causal, fwd and fwd+bwd, 2 threads.
  for (bool bwd : {false, true})
    for (Kernel k : kernels)
      for (Vis v : {Vis::full, Vis::causal}) {
        const std::string name = std::string("attention/") + continuum::kernel_name(k) + "/" + vis_name(v) +
                                 (bwd ? "/fwdbwd" : "/fwd") + "/bf16";
        shape(benchmark::RegisterBenchmark(name.c_str(), BM_attention<continuum::bfloat16>, k, v, bwd, true), N,
              D, 2);
      }
  // float16 storage (float accumulation, float's stencil, vector products):
  // continuum and softmax, full and causal, fwd and fwd+bwd, 2 threads.
  for (bool bwd : {false, true})
    for (Kernel k : {Kernel::continuum, Kernel::softmax})
      for (Vis v : {Vis::full, Vis::causal}) {
        const std::string name = std::string("attention/") + continuum::kernel_name(k) + "/" + vis_name(v) +
                                 (bwd ? "/fwdbwd" : "/fwd") + "/f16";
        shape(benchmark::RegisterBenchmark(name.c_str(), BM_attention<continuum::float16>, k, v, bwd, true), N,
              D, 2);
      }
  // Sequence scaling: continuum forward, full, 1 and 2 threads, tiled kernels
  // (2048 is above). Compute::float64 is measured at 2048 only.
  for (int th : {2, 1})
    for (long n : {256L, 512L, 1024L, 4096L, 8192L, 16384L})
      shape(benchmark::RegisterBenchmark("seqscale/continuum/full/fwd/f32", BM_attention<float>, Kernel::continuum,
                                         Vis::full, false, true),
            n, D, th);
}

// ---------------------------------------------------------------------------
// Memory probe (not a benchmark: one call, peak RSS).
// ---------------------------------------------------------------------------
long peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;  // KiB on Linux
}

int memory_probe(long n, long d, bool float_arith /* false: Compute::float64 */) {
  Problem<float> p(n, d, true);  // allocates and touches every tensor
  const long before = peak_rss_kib();
  continuum::ForwardArgs<float> fa;
  fa.query = p.cview(p.q);
  fa.key = p.cview(p.k);
  fa.value = p.cview(p.v);
  fa.out = p.view(p.o);
  fa.lse = p.lse.data();
  fa.visibility.causal = true;
  fa.num_threads = 2;
  fa.compute = float_arith ? continuum::Compute::automatic : continuum::Compute::float64;
  const auto t0 = std::chrono::steady_clock::now();
  continuum::attention_forward(continuum::cpu, fa);
  const auto t1 = std::chrono::steady_clock::now();
  const long after_fwd = peak_rss_kib();
  const continuum::BackwardArgs<float> ba = backward_args(fa, p);
  continuum::attention_backward(continuum::cpu, ba);
  const auto t2 = std::chrono::steady_clock::now();
  const long after_bwd = peak_rss_kib();
  bool finite = true;
  for (float x : p.o) finite = finite && std::isfinite(x);
  for (float x : p.dq) finite = finite && std::isfinite(x);
  std::printf(
      "{\"n\": %ld, \"d\": %ld, \"heads\": %d, \"causal\": true, \"compute\": \"%s\", "
      "\"tensors_mib\": %.1f, "
      "\"fwd_extra_mib\": %.2f, \"bwd_extra_mib\": %.2f, \"fwd_s\": %.3f, \"bwd_s\": %.3f, "
      "\"finite\": %s}\n",
      n, d, kHeads, float_arith ? "automatic" : "float64", double(before) / 1024.0, double(after_fwd - before) / 1024.0,
      double(after_bwd - before) / 1024.0, std::chrono::duration<double>(t1 - t0).count(),
      std::chrono::duration<double>(t2 - t1).count(), finite ? "true" : "false");
  return finite ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--memory_probe") == 0) {
    const long n = argc > 2 ? std::atol(argv[2]) : 32768;
    const long d = argc > 3 ? std::atol(argv[3]) : 16;
    if (n <= 0 || d <= 0) {
      std::fprintf(stderr, "usage: %s --memory_probe N D [float64]   (N, D > 0)\n", argv[0]);
      return 2;
    }
    const bool fa = !(argc > 4 && std::strcmp(argv[4], "float64") == 0);
    return memory_probe(n, d, fa);
  }
  // Measure the peaks before anything else runs (also reported as context).
  for (int th : {1, 2}) {
    benchmark::AddCustomContext("peak_f32_threads" + std::to_string(th),
                                std::to_string(peak<float>(th)));
    benchmark::AddCustomContext("peak_f64_threads" + std::to_string(th),
                                std::to_string(peak<double>(th)));
  }
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("isa", kernel_isa());
  for (int th : {1, 2})
    benchmark::AddCustomContext("peak_bf16_threads" + std::to_string(th),
                                std::to_string(peak<continuum::bfloat16>(th)));
  benchmark::AddCustomContext("bf16_unit", bf16_unit());
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// bench/cuda/bench_cuda_attention.cu — throughput of the CUDA backend: forward
// and forward+backward TFLOP/s of continuum and softmax attention at batch 4,
// heads 16, seq 1024/4096/16384, head_dim 64/128, causal and not, bf16 storage,
// next to a cuBLAS bf16 GEMM of the Q·Kᵀ shape as the peak reference.
//
// FLOP formulas (flash-attention's convention, written here so the numbers can
// be checked): forward = 4·B·H·Lq·Lk·D (Q·Kᵀ and P·V, 2 flops per multiply-add),
// halved when causal; forward+backward = 3.5 × forward (backward = 2.5 ×
// forward). The stencil's exp/moment evaluations are not counted, nor is this
// backend's extra work (the halo columns, the row-statistics pass), so the
// figures are comparable with FlashAttention's. cuBLAS: 2·L·L·D per (b, h).
//
// Timing: cudaEvent around `reps` calls after one warm-up call; reps chosen
// so that a measurement takes about 0.3 s (at least 1). A time budget
// (--budget seconds, default 240) skips the remaining configurations when the
// next one would not fit; --quick runs seq 1024 and 4096 only.
//
// Usage: bench_cuda_attention [--quick] [--budget SECONDS]
#include <continuum/backends/cuda.cuh>

#include <cublas_v2.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace continuum;
using bf16 = __nv_bfloat16;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_attention: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench_cuda_attention: %s: cuBLAS status %d\n", what, int(s));
    std::exit(1);
  }
}

__global__ void fill_uniform(bf16* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t x = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; x < n;
       x += std::uint64_t(gridDim.x) * blockDim.x) {
    std::uint64_t h = x + seed * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    p[x] = __float2bfloat16_rn(float(h >> 40) / float(1ull << 23) - 1.0f);  // [-1, 1)
  }
}

/// Seconds per call of f: one warm-up, then reps calls timed with events.
template <class F>
double time_call(F f) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  f();
  check(cudaDeviceSynchronize(), "warm-up");
  check(cudaEventRecord(a), "record");
  f();
  check(cudaEventRecord(b), "record");
  check(cudaEventSynchronize(b), "sync");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "elapsed");
  const int reps = ms > 300 ? 1 : ms < 15 ? 20 : int(300 / ms);
  check(cudaEventRecord(a), "record");
  for (int r = 0; r < reps; ++r) f();
  check(cudaEventRecord(b), "record");
  check(cudaEventSynchronize(b), "sync");
  check(cudaEventElapsedTime(&ms, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 1e3 / reps;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  double budget = 240;
  for (int a = 1; a < argc; ++a) {
    if (!std::strcmp(argv[a], "--quick")) quick = true;
    else if (!std::strcmp(argv[a], "--budget") && a + 1 < argc) budget = std::atof(argv[++a]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--budget SECONDS]\n", argv[0]);
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("# device: %s (sm_%d%d), bf16 storage, fp32 accumulation, batch 4, heads 16\n",
              prop.name, prop.major, prop.minor);
  std::printf("%-9s %6s %4s %6s %10s %9s %10s %9s %11s\n", "kernel", "seq", "D", "causal",
              "fwd_ms", "fwd_TF/s", "fwdbwd_ms", "f+b_TF/s", "cuBLAS_TF/s");
  cublasHandle_t blas;
  check(cublasCreate(&blas), "cublasCreate");
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const index_t B = 4, H = 16;
  double sec_per_flop = 0;  // the slowest rate seen, to predict the next configuration
  std::vector<index_t> seqs = {1024, 4096, 16384};
  if (quick) seqs = {1024, 4096};
  for (index_t L : seqs) {
    for (index_t D : {64, 128}) {
      const std::uint64_t n = std::uint64_t(B * H * L * D);
      std::vector<bf16*> t(8);
      for (auto& p : t) check(cudaMalloc(&p, n * sizeof(bf16)), "cudaMalloc");
      float* lse = nullptr;
      check(cudaMalloc(&lse, sizeof(float) * B * H * L), "cudaMalloc");
      for (int x = 0; x < 4; ++x) fill_uniform<<<1024, 256>>>(t[x], n, x + 1);
      auto view = [&](int x) { return TensorView<bf16>::bhsd(t[x], B, H, L, D); };
      // cuBLAS reference: S = Q Kᵀ per (b, h), bf16 in/out, fp32 compute;
      // as many (b, h) as fit 2 GiB of S.
      const index_t nb = std::max<index_t>(1, std::min<index_t>(B * H, (index_t(1) << 31) / (L * L * 2)));
      bf16* s = nullptr;
      check(cudaMalloc(&s, std::size_t(nb) * L * L * sizeof(bf16)), "cudaMalloc S");
      const float one = 1, zero = 0;
      const double t_gemm = time_call([&] {
        check(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(L), int(L), int(D), &one,
                                         t[1], CUDA_R_16BF, int(D), L * D, t[0], CUDA_R_16BF, int(D),
                                         L * D, &zero, s, CUDA_R_16BF, int(L), L * L, int(nb),
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
      });
      const double tf_gemm = 2.0 * L * L * D * nb / t_gemm / 1e12;
      cudaFree(s);
      for (bool causal : {false, true}) {
        for (Kernel kern : {Kernel::continuum, Kernel::softmax}) {
          const double flops_fwd = 4.0 * B * H * L * L * D * (causal ? 0.5 : 1.0);
          if (sec_per_flop > 0 && elapsed() + 14 * flops_fwd * sec_per_flop > budget) {
            std::printf("%-9s %6lld %4lld %6s %10s (skipped: time budget)\n", kernel_name(kern),
                        (long long)L, (long long)D, causal ? "yes" : "no", "-");
            continue;
          }
          ForwardArgs<bf16> fa;
          fa.query = view(0); fa.key = view(1); fa.value = view(2); fa.out = view(4);
          fa.lse = lse; fa.kernel = kern; fa.visibility.causal = causal;
          BackwardArgs<bf16> ba;
          ba.query = fa.query; ba.key = fa.key; ba.value = fa.value;
          ba.out = view(4); ba.grad_out = view(3); ba.lse = lse;
          ba.grad_query = view(5); ba.grad_key = view(6); ba.grad_value = view(7);
          ba.kernel = kern; ba.visibility.causal = causal;
          const double t_fwd = time_call([&] { attention_forward(continuum::cuda, fa); });
          const double t_fb = time_call([&] {
            attention_forward(continuum::cuda, fa);
            attention_backward(continuum::cuda, ba);
          });
          sec_per_flop = std::max(sec_per_flop, t_fb / (3.5 * flops_fwd));
          std::printf("%-9s %6lld %4lld %6s %10.3f %9.2f %10.3f %9.2f %11.2f\n", kernel_name(kern),
                      (long long)L, (long long)D, causal ? "yes" : "no", t_fwd * 1e3,
                      flops_fwd / t_fwd / 1e12, t_fb * 1e3, 3.5 * flops_fwd / t_fb / 1e12, tf_gemm);
          std::fflush(stdout);
        }
      }
      for (auto* p : t) cudaFree(p);
      cudaFree(lse);
    }
  }
  cublasDestroy(blas);
  return 0;
}

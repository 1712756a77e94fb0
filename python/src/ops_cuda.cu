// ops_cuda.cu — the CUDA half of the PyTorch operator (opt-in build): converts
// cuda_entry's plain structs into the library's ForwardArgs / BackwardArgs and
// calls continuum::attention_forward / attention_backward(continuum::cuda, ...).
#include <continuum/backends/cuda.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_entry.hpp"

namespace continuum_torch::cuda_entry {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("continuum_attention (CUDA): ") + what + ": " +
                             cudaGetErrorString(e));
}

template <class T>
continuum::TensorView<T> view(const View& v) {
  return {static_cast<T*>(v.data), v.batch, v.heads, v.seq, v.dim,
          v.stride_batch, v.stride_head, v.stride_seq, v.stride_dim};
}

template <class Args>
void fill_common(Args& a, const Common& c) {
  a.kernel = c.kernel;
  a.visibility = c.visibility;
  a.temperature.shape = c.temperature_shape;
  a.temperature.value = c.temperature_value;
  a.temperature.data = c.temperature_data;
  if (c.has_scale) a.scale = c.scale;
}

/// The library launches on the legacy default stream; PyTorch's current
/// stream may be another one. Make the default stream wait for the current
/// one before, and the current one for the default stream after.
struct StreamOrder {
  cudaStream_t current;
  explicit StreamOrder(void* s) : current(static_cast<cudaStream_t>(s)) { join(current, nullptr); }
  ~StreamOrder() {  // runs during unwinding too: never throws
    try {
      join(nullptr, current);
    } catch (...) {
    }
  }
  static void join(cudaStream_t from, cudaStream_t to) {
    if (from == to) return;
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(e, from), "cudaEventRecord");
    check(cudaStreamWaitEvent(to, e, 0), "cudaStreamWaitEvent");
    check(cudaEventDestroy(e), "cudaEventDestroy");
  }
};

template <class T>
void forward_t(const Forward& f) {
  continuum::ForwardArgs<T> a;
  a.query = view<const T>(f.query);
  a.key = view<const T>(f.key);
  a.value = view<const T>(f.value);
  a.out = view<T>(f.out);
  a.lse = f.lse;
  fill_common(a, f.c);
  StreamOrder order(f.c.stream);
  continuum::attention_forward(continuum::cuda, a);
  check(cudaGetLastError(), "forward launch");
}

template <class T>
void backward_t(const Backward& b) {
  continuum::BackwardArgs<T> a;
  a.query = view<const T>(b.query);
  a.key = view<const T>(b.key);
  a.value = view<const T>(b.value);
  a.out = view<const T>(b.out);
  a.grad_out = view<const T>(b.grad_out);
  a.grad_query = view<T>(b.grad_query);
  a.grad_key = view<T>(b.grad_key);
  a.grad_value = view<T>(b.grad_value);
  a.lse = b.lse;
  a.grad_temperature = b.grad_temperature;
  fill_common(a, b.c);
  StreamOrder order(b.c.stream);
  continuum::attention_backward(continuum::cuda, a);
  check(cudaGetLastError(), "backward launch");
}

}  // namespace

void forward(const Forward& f) {
  switch (f.c.storage) {
    case Storage::f32: forward_t<float>(f); break;
    case Storage::f16: forward_t<__half>(f); break;
    case Storage::bf16: forward_t<__nv_bfloat16>(f); break;
  }
}

void backward(const Backward& b) {
  switch (b.c.storage) {
    case Storage::f32: backward_t<float>(b); break;
    case Storage::f16: backward_t<__half>(b); break;
    case Storage::bf16: backward_t<__nv_bfloat16>(b); break;
  }
}

}  // namespace continuum_torch::cuda_entry

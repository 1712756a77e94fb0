// cuda_entry.hpp — the boundary between ops.cpp (g++, PyTorch headers) and
// ops_cuda.cu (nvcc, the library's CUDA backend, no PyTorch headers): plain
// structs, so neither compiler sees the other's headers. Only with
// CONTINUUM_ATTENTION_WITH_CUDA (opt-in, python/CMakeLists.txt).
#pragma once

#include <cstdint>

#include <continuum/attention/params.hpp>

namespace continuum_torch::cuda_entry {

enum class Storage { f32, f16, bf16 };

/// A [B, H, L, D] view of device memory of the call's storage type.
struct View {
  void* data = nullptr;
  std::int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  std::int64_t stride_batch = 0, stride_head = 0, stride_seq = 0, stride_dim = 1;
};

/// Everything but the tensors: the same meaning as ForwardArgs' fields. Device
/// pointers; lse, temperature data and dτ are float (accum_t of every CUDA
/// storage type).
struct Common {
  Storage storage = Storage::f32;
  continuum::Kernel kernel = continuum::Kernel::continuum;
  continuum::Visibility visibility{};
  continuum::TemperatureShape temperature_shape = continuum::TemperatureShape::scalar;
  float temperature_value = 1.0f;
  const float* temperature_data = nullptr;
  bool has_scale = false;
  double scale = 0.0;
  void* stream = nullptr;  ///< cudaStream_t to order against (the caller's current stream)
};

struct Forward {
  Common c;
  View query, key, value, out;
  float* lse = nullptr;
};

struct Backward {
  Common c;
  View query, key, value, out, grad_out, grad_query, grad_key, grad_value;
  const float* lse = nullptr;
  float* grad_temperature = nullptr;
};

/// Run the library's CUDA forward / backward on the legacy default stream,
/// ordered after and before work on `c.stream`. \throws std::invalid_argument
/// (bad arguments, the library's messages), std::runtime_error (CUDA errors).
void forward(const Forward& f);
void backward(const Backward& b);

}  // namespace continuum_torch::cuda_entry

// tests/cuda/cuda_unavailable.cpp — must NOT compile (CTest
// cuda_backend_unavailable_is_a_compile_error expects backend.hpp's
// static_assert message): a host-compiled file that names the CUDA backend
// through the public API gets the primary attention_impl<cuda_t>, whose
// static_assert explains what the CUDA backend needs.
#include <continuum/continuum.hpp>

int main() {
  float q[4] = {}, k[4] = {}, v[4] = {}, o[4] = {};
  continuum::ForwardArgs<float> args;
  args.query = continuum::TensorView<const float>::bhsd(q, 1, 1, 1, 4);
  args.key = continuum::TensorView<const float>::bhsd(k, 1, 1, 1, 4);
  args.value = continuum::TensorView<const float>::bhsd(v, 1, 1, 1, 4);
  args.out = continuum::TensorView<float>::bhsd(o, 1, 1, 1, 4);
  continuum::attention_forward(continuum::cuda, args);
  return 0;
}

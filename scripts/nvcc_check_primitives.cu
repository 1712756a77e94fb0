// Compile check (no GPU needed): every primitive of include/continuum/math/ called
// from a __global__ kernel, float and double. Run from the repository root:
//   nvcc -std=c++17 -x cu -arch=sm_80 -Iinclude -c scripts/nvcc_check_primitives.cu \
//        -o /tmp/prims.o -Xptxas -v --Werror all-warnings
#include <continuum/math/density.hpp>

template <class T>
__global__ void all_primitives(const T* a, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const T x = a[i], y = a[(i + 1) % n], z = a[(i + 2) % n];
  T r = continuum::mu0(x) + continuum::mu1(x) + continuum::mu2(x) + continuum::nu(x) +
        continuum::kappa(x) + continuum::nu2(x);
  r += continuum::segment_weight(x, y) + continuum::segment_weight_dx(x, y) +
       continuum::segment_weight_dy(x, y) + continuum::half_cell_weight(x) +
       continuum::half_segment_mass(x, y);
  using C = continuum::ContinuumStencil;
  r += C::weight(x, y, z, true, false) + C::weight_ds(x, y, z, false, true) + C::coupling(x, y) +
       C::cell_mass(x, y, z, true, true);
  using S = continuum::SoftmaxStencil;
  r += S::weight(x, y, z, true, true) + S::weight_ds(x, y, z, true, true) + S::coupling(x, y) +
       S::cell_mass(x, y, z, true, true);
  out[i] = r;
}
template __global__ void all_primitives<float>(const float*, float*, int);
template __global__ void all_primitives<double>(const double*, double*, int);

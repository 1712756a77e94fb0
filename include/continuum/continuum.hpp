// continuum.hpp — umbrella header: Continuum Attention on the CPU.
// (CPU only: the CUDA backend is <continuum/backends/cuda.cuh>.)
#pragma once

#include "config.hpp"
#include "math/moments.hpp"
#include "math/curve.hpp"
#include "math/density.hpp"
#include "attention/params.hpp"
#include "attention/visibility.hpp"
#include "attention/validate.hpp"
#include "attention/forward.hpp"
#include "attention/backward.hpp"
#include "backends/backend.hpp"
#include "backends/cpu.hpp"

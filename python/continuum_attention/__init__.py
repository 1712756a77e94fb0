"""Continuum Attention (CA) as a PyTorch operator.

``continuum_attention.attention(query, key, value, ...)`` computes Continuum
Attention, or the softmax / focal baselines through the same operator, with the
header-only C++ library of this repository (docs/MATH.md §3-§8) as its CPU kernel
and the library's analytic backward as its gradient. See ``attention`` for
shapes, dtypes and errors, and the "PyTorch" section of the repository's
README.md for installation and a usage example.
"""
from ._ops import WITH_CUDA, attention, cpu_isa, cpu_model, supported_dtypes

__all__ = ["attention", "cpu_isa", "cpu_model", "supported_dtypes", "WITH_CUDA"]
__version__ = "0.1.0"

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # reference.py, ddp_worker.py


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def uniform(*shape, dtype=torch.float64, requires_grad=False, gen=None):
    """Uniform in [-1, 1), as the library's tests and benchmarks."""
    t = torch.rand(*shape, dtype=dtype, generator=gen) * 2 - 1
    return t.requires_grad_(requires_grad)

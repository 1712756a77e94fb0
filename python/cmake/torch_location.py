"""Prints, one per line (CMake list), torch's package folder, its
_GLIBCXX_USE_CXX11_ABI flag (0/1) and its version, for python/CMakeLists.txt.

torch is imported when it can be; under pip's build isolation the
environment's own site-packages are not on sys.path, so it is then looked up
there (sysconfig's purelib/platlib of this interpreter's prefix) and imported
from that folder."""
import importlib
import os
import sys
import sysconfig

try:
    import torch
except ImportError:
    places = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    found = [p for p in places if os.path.isdir(os.path.join(p, "torch"))]
    if not found:
        sys.exit("torch not found")
    sys.path.insert(0, found[0])
    torch = importlib.import_module("torch")

print(";".join([os.path.dirname(torch.__file__), str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
                torch.__version__]), end="")

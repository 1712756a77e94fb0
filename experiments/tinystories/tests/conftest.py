import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the experiment's modules: config, data, model, ...

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    """~60 kB of English-like text that needs no data folder (the tests must
    run where ../shared is absent)."""
    import random
    rng = random.Random(0)
    words = ("once upon a time there was a little girl named lily she loved to play outside "
             "with her dog and her friend tom one day they found a big red ball in the park "
             "the sun was warm and happy").split()
    lines = []
    for _ in range(1200):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))).capitalize() + ".")
    p = tmp_path_factory.mktemp("text") / "text.txt"
    p.write_text("\n".join(lines) + "\n")
    return str(p)

"""The usage example in the repository's README.md runs as printed."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


@pytest.mark.skipif(not os.path.exists(README), reason="not run from a checkout")
def test_readme_example_runs(capsys):
    text = open(README, encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "continuum_attention as ca" in b]
    assert len(blocks) == 1
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert "torch.Size([2, 8, 128, 64])" in capsys.readouterr().out

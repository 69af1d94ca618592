"""Every ```python block of README.md (and of docs/arrays.md) runs as pasted, each in a fresh interpreter.

A block whose first line is ``# NAME.py`` is a program the README says to save
and launch: it runs as the README's ``devkit-run -n 4 -- python NAME.py`` does
(with 2 ranks, to stay light)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", flags=re.S | re.M)
BLOCKS = BLOCK.findall(README.read_text())
PROGRAM = re.compile(r"# (\w+\.py)\n")
# Extras a block may need, by the module it imports, and how to install each.
EXTRAS = {"torch": "pip install 'devkit[torch]'", "pyopencl": "pip install 'devkit[opencl]'"}


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3
    assert any(PROGRAM.match(block) for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS + BLOCK.findall((ROOT / "docs" / "arrays.md").read_text()),
                         ids=[f"block{i}" for i in range(len(BLOCKS))] + ["docs-arrays"])
def test_readme_block_runs_as_pasted(block, tmp_path):
    for module, install in EXTRAS.items():
        if re.search(rf"^(import|from) {module}\b", block, re.M) and importlib.util.find_spec(module) is None:
            pytest.skip(reason=f"the block imports {module}, which is not installed ({install})")
    program = PROGRAM.match(block)
    if program:
        (tmp_path / program.group(1)).write_text(block)
        devkit_run = Path(sys.executable).with_name("devkit-run")
        command = [str(devkit_run), "-n", "2", "--", sys.executable, program.group(1)]
    else:
        command = [sys.executable, "-c", block]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    if program:  # all_reduce of 1 and 2 on two ranks
        assert "[rank 0] 0 [3. 3. 3. 3.]" in result.stdout and "[rank 1] 1 [3. 3. 3. 3.]" in result.stdout

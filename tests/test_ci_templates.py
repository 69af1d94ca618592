"""The CI templates in ci/ run a devkit-conformance command that works as written."""

import os
import re
import shlex
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

CI_DIR = Path(__file__).parent.parent / "ci"
TEMPLATES = ["github-actions.yml", "gitlab-ci.yml"]


def conformance_command(template: Path) -> list[str]:
    lines = [line.strip().removeprefix("- ") for line in template.read_text().splitlines()
             if line.strip().removeprefix("- ").startswith("devkit-conformance ")]
    assert len(lines) == 1, f"{template.name}: expected one devkit-conformance command"
    return shlex.split(lines[0])


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_sets_its_variables_and_publishes_the_reports(name):
    text = (CI_DIR / name).read_text()
    for variable in ("DEVKIT_PLUGIN", "DEVKIT_SOURCE"):
        assert re.search(rf"^\s+{variable}: \S+", text, re.M), f"{name} does not set {variable}"
    assert "reports/" in text and 'pip install "$DEVKIT_SOURCE" .' in text


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_command_runs_and_writes_its_reports(name, tmp_path):
    command = conformance_command(CI_DIR / name)
    assert command[1] == "$DEVKIT_PLUGIN"
    command[1] = "cpu"
    (tmp_path / "reports").mkdir()
    # The template's own options, narrowed to a few cases so the check stays quick.
    result = subprocess.run([*command, "--suite", "runtime", "-k", "test_alloc_free"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert result.returncode == 0, result.stdout + result.stderr
    junit = ElementTree.parse(tmp_path / "reports" / "conformance-junit.xml").getroot()
    assert sum(int(suite.get("tests")) for suite in junit.iter("testsuite")) >= 1
    assert (tmp_path / "reports" / "conformance.json").stat().st_size > 0
    assert (tmp_path / "reports" / "conformance.md").read_text().strip()

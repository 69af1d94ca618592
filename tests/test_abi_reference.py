"""docs/abi-reference.md is what scripts/gen_abi_reference.py makes of
devkit/abi/devkit.h (so a stale reference fails CI), and it documents the
whole ABI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.abi import ffi, struct_fields
from devkit.plugin import OPTIONAL_FUNCTIONS, REQUIRED_FUNCTIONS

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "gen_abi_reference.py"
REFERENCE = ROOT / "docs" / "abi-reference.md"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def entry(name: str) -> str:
    """The reference's text for one struct or enum: its heading to the next."""
    text = REFERENCE.read_text()
    start = text.index(f'<a id="{name.lower()}"></a>')
    return text[start:text.find("\n### ", start)]


def test_the_reference_is_current():
    result = run_script("--check")
    assert result.returncode == 0, result.stderr


def test_check_names_a_stale_reference(tmp_path):
    stale = tmp_path / "abi-reference.md"
    stale.write_text(REFERENCE.read_text().replace("Blocks until all work", "Waits for all work", 1))
    result = run_script("--check", "--output", str(stale))
    assert result.returncode == 1
    assert f"{stale} is stale" in result.stderr and "python3 scripts/gen_abi_reference.py" in result.stderr
    assert re.search(r"^-.*Waits for all work", result.stderr, re.M)  # the diff shows what differs


def test_every_api_function_is_there_as_required_or_optional():
    text = REFERENCE.read_text()
    for function in REQUIRED_FUNCTIONS:
        assert f'<a id="dk_deviceapi-{function}"></a>`{function}` (required)' in text, function
    for function in OPTIONAL_FUNCTIONS:
        assert f'<a id="dk_deviceapi-{function}"></a>`{function}` (optional: may be NULL)' in text, function


def test_status_codes_have_their_values_and_comments():
    table = entry("DK_StatusCode")
    for name, value in ffi.typeof("enum DK_StatusCode").relements.items():
        assert f"| `{name}` | `{value}` |" in table, name
    assert "| `DK_NOT_READY` | `101` | not an error: work is still pending |" in table


@pytest.mark.parametrize("struct", ["DK_Tensor", "DK_HostInfo", "DK_DeviceProperties", "DK_Attribute",
                                    "DK_KernelCall", "DK_KernelEntry", "DK_PluginInfo"])
def test_every_struct_field_is_there(struct):
    table = entry(struct)
    for field in struct_fields(struct):
        assert f"| `{field}` |" in table, f"{struct}.{field}"


def test_ownership_comments_are_carried():
    assert "| `name` | `const char *name` | (owned by the plugin) e.g. \"cpu\" |" in entry("DK_PluginInfo")
    assert ("| `log_user_data` | `void *log_user_data` | (borrowed) passed back to `log` |"
            in entry("DK_HostInfo"))


def test_the_rules_and_section_introductions_are_there():
    text = REFERENCE.read_text()
    for title in ("Versioning", "Error model", "Conventions"):
        assert f'### <a id="{title.lower().replace(" ", "-")}"></a>{title}' in text
    assert "5. A plugin built against an older minor version keeps loading" in text
    assert "Functions are required unless marked OPTIONAL" in text


def test_every_link_has_its_anchor():
    text = REFERENCE.read_text()
    anchors = set(re.findall(r'<a id="([^"]+)">', text))
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links and links <= anchors, sorted(links - anchors)

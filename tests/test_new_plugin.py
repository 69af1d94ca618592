"""``devkit new-plugin``: the project it writes is the vendor's code only (at
most 400 lines of C) on devkit's plugin-support library, compiled in from the
installed devkit; it builds warning-free, loads, and passes the runtime,
robustness and graphs conformance suites; rebuilt against a newer devkit it
has the newer library. Bad names and occupied directories are refused; the
acme example is the scaffold's output; the ABI 1.0 test plugin still loads."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

import devkit
from devkit import abi, cli, new_plugin

from tests.conftest import run_python

NAME = "tpu"
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vendor_plugin"
ABI_1_0_PLUGIN = Path(__file__).parent / "plugins" / "abi_1_0"
# The devkit under test: builds and runs in other directories import this one.
DEVKIT_ROOT = Path(devkit.__file__).resolve().parent.parent
VENDOR_SOURCES = {"src/plugin.c", "src/hooks.h", "src/hooks.c", "src/kernels/relu.c", "src/kernels/add.c"}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("new-plugin") / f"devkit-plugin-{NAME}"
    assert cli.main(["new-plugin", NAME, str(directory)]) == 0
    return directory


def environment(devkit_root: Path = DEVKIT_ROOT, **variables) -> dict[str, str]:
    """os.environ, with ``devkit_root``'s devkit first on the path."""
    path = os.pathsep.join(filter(None, [str(devkit_root), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **variables}


def build(project: Path, devkit_root: Path = DEVKIT_ROOT) -> Path:
    """Builds the project in place, as its README says, against the devkit at
    ``devkit_root``, warnings made errors; returns the library."""
    result = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=project,
                            env=environment(devkit_root, CFLAGS="-Werror"), capture_output=True,
                            text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "warning:" not in result.stderr, result.stderr
    assert "beta" not in result.stderr  # setuptools < 68 (a default venv's 65) on a [tool.setuptools] table
    return project / "src" / f"devkit_plugin_{NAME}" / f"libdevkit_{NAME}.so"


# -- names and directories ------------------------------------------------------------


@pytest.mark.parametrize("name", ["Acme", "1acme", "acme-npu", "acme npu", "_acme", "", "cpu", "dks", "dks_x"])
def test_invalid_names_are_refused(name, tmp_path, capsys):
    assert cli.main(["new-plugin", name, str(tmp_path / "out")]) == 2
    assert "invalid plugin name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_non_empty_directory_is_refused_without_force(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["new-plugin", NAME, str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]

    assert cli.main(["new-plugin", NAME, str(tmp_path), "--force"]) == 0
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "src" / "plugin.c").exists()


def test_the_default_directory_is_named_after_the_plugin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new-plugin", "myaccel"]) == 0
    assert "myaccel_hooks" in (tmp_path / "devkit-plugin-myaccel" / "src" / "hooks.c").read_text()


# -- what it writes ---------------------------------------------------------------------


def test_the_project_has_its_files(project):
    expected = VENDOR_SOURCES | {
        f"src/devkit_plugin_{NAME}/__init__.py", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md",
        ".github/workflows/conformance.yml", ".gitignore"}
    assert {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()} == expected


def test_the_vendor_owns_at_most_400_lines_of_c(project):
    """The C in the project is the vendor's (no copy of the support library or
    of devkit.h, which come from the installed devkit), and it is short."""
    lines = {str(p.relative_to(project)): len(p.read_text().splitlines())
             for p in project.rglob("*") if p.suffix in (".c", ".h")}
    assert set(lines) == VENDOR_SOURCES
    assert sum(lines.values()) <= 400, lines


def test_pyproject_registers_the_entry_point_and_builds_with_devkit(project):
    whole = tomllib.loads((project / "pyproject.toml").read_text())
    # setup.py compiles the installed devkit's support library: devkit is needed to build, and to run.
    devkit_requirement = f"devkit>={devkit.__version__}"
    assert whole["build-system"]["requires"] == ["setuptools>=61", devkit_requirement]  # a default venv's 65 suffices
    assert "tool" not in whole
    pyproject = whole["project"]
    assert pyproject["name"] == f"devkit-plugin-{NAME}"
    assert pyproject["dependencies"] == [devkit_requirement]
    assert pyproject["entry-points"]["devkit.plugins"] == {NAME: f"devkit_plugin_{NAME}:library_path"}


def test_readme_lists_the_variables_the_plugin_reads(project):
    """The library's variables and the hooks' own, all read through dks_env."""
    sources = [*abi.support_sources(), *(project / path for path in VENDOR_SOURCES)]
    read = {f"DEVKIT_{NAME.upper()}_{suffix}"
            for source in sources for suffix in re.findall(r'\bdks_env\("(\w+)"\)', Path(source).read_text())}
    listed = set(re.findall(r"^\| `(\w+)` \|", (project / "README.md").read_text(), re.M))
    assert f"DEVKIT_{NAME.upper()}_DEVICES" in read and read == listed


def workflow_command(project: Path) -> list[str]:
    lines = [line.strip() for line in (project / ".github/workflows/conformance.yml").read_text().splitlines()
             if line.strip().startswith("devkit-conformance ")]
    assert len(lines) == 1, "expected one devkit-conformance command in the workflow"
    return shlex.split(lines[0])


@pytest.mark.timeout(900)
def test_built_project_loads_and_passes_the_runtime_robustness_and_graphs_suites(project):
    """Built with the project's own setup.py (not installed: the test must not touch
    the interpreter's packages), found by name through DEVKIT_PLUGIN_PATH."""
    library = build(project)
    package = library.parent

    # In the project's directory Python does not see the source package (src layout), so the README's
    # commands there use the installed one; here, not installed, there is none.
    shadow = subprocess.run([sys.executable, "-c", f"import importlib.util; "
                             f"print(importlib.util.find_spec('devkit_plugin_{NAME}'))"],
                            cwd=project, capture_output=True, text=True, timeout=60)
    assert shadow.stdout == "None\n", shadow.stderr

    loaded = run_python(f"""
import sys
sys.path.insert(0, {str(project / "src")!r})
import devkit, devkit_plugin_{NAME} as package
plugin = devkit.load_plugin(package.library_path())
print(plugin.name, plugin.device_type, plugin.abi_version, plugin.has_graphs, sorted(plugin.kernels))
""")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split(" ", 2)[:2] == [NAME, NAME]
    assert f"{(abi.ABI_MAJOR, abi.ABI_MINOR)} True" in loaded.stdout  # the installed devkit's ABI, with graphs
    assert "[('Add', 2, 32, 3), ('Relu', 2, 32, 3)]" in loaded.stdout  # float32, strided inputs and outputs

    # The robustness suite: the kernels and the launcher refuse every malformed call.
    command = workflow_command(project)
    assert command[:8] == ["devkit-conformance", NAME, "--suite", "runtime", "--suite", "robustness",
                           "--suite", "graphs"]
    (project / "reports").mkdir()
    result = subprocess.run([sys.executable, "-m", "devkit.conformance_cli", *command[1:]], cwd=project,
                            capture_output=True, text=True, timeout=540,
                            env=environment(DEVKIT_PLUGIN_PATH=str(package)))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    junit = ElementTree.parse(project / "reports" / "conformance-junit.xml").getroot()
    suites = list(junit.iter("testsuite"))
    assert sum(int(s.get("tests")) for s in suites) > 50
    assert sum(int(s.get("failures")) + int(s.get("errors")) for s in suites) == 0
    report = (project / "reports" / "conformance.md").read_text()
    assert "runtime" in report and "robustness" in report and "graphs" in report
    cases = {case.get("name"): case for case in junit.iter("testcase")}
    for op in ("Relu", "Add"):
        case = cases[f"test_kernel_call[{NAME}-{op}/float32]"]
        assert not list(case), f"the {op} kernel must refuse each of its malformed calls"
    graphs = [name for name, case in cases.items() if "rebind_inputs_and_outputs" in name and not list(case)]
    assert any("native" in name for name in graphs), "the library's graph section ran the graph cases"


# -- upgrading devkit ----------------------------------------------------------------


def describe(library: Path) -> tuple[str, str]:
    """(the plugin's init log line, the message of a load refused for a bad
    DEVKIT_<NAME>_THREADS), each from a fresh process."""
    code = f"""
import logging, sys
import devkit
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
try:
    devkit.load_plugin({str(library)!r})
except devkit.DevkitError as error:
    print(error)
"""
    loaded = run_python(code, env=environment())
    refused = run_python(code, env=environment(**{f"DEVKIT_{NAME.upper()}_THREADS": "many"}))
    assert loaded.returncode == 0 and refused.returncode == 0, loaded.stderr + refused.stderr
    init_line = [line for line in loaded.stdout.splitlines() if line.startswith(f"devkit {NAME} plugin")]
    assert len(init_line) == 1, loaded.stdout
    return init_line[0], refused.stdout


@pytest.mark.timeout(900)
def test_a_rebuild_after_upgrading_devkit_has_the_newer_support_library(tmp_path):
    """Every later fix to the support library reaches a generated plugin by
    upgrading devkit and rebuilding. The newer devkit here is a copy of this
    one whose support library carries a change in a header (DKS_VERSION
    one minor version up) and one in a source (the message of an invalid
    configuration variable, dks.h's dks_config_error); the project is built,
    then rebuilt unchanged against the copy, and the rebuilt plugin shows
    both."""
    project = tmp_path / "project"
    files = {path: path.read_bytes() for path in new_plugin.generate(NAME, project)}
    library = build(project)
    version = re.search(r'#define DKS_VERSION "(\d+)\.(\d+)"', (Path(abi.support_dir()) / "dks.h").read_text())
    major, minor = int(version.group(1)), int(version.group(2))
    init_line, refusal = describe(library)
    assert f"(support library {major}.{minor})" in init_line
    assert "is invalid: expected" in refusal

    newer = tmp_path / "newer"
    shutil.copytree(DEVKIT_ROOT / "devkit", newer / "devkit", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    support = newer / "devkit" / "abi" / "support"
    header = (support / "dks.h").read_text()
    header = header.replace(f"#define DKS_VERSION_MINOR {minor}\n", f"#define DKS_VERSION_MINOR {minor + 1}\n")
    header = header.replace(f'#define DKS_VERSION "{major}.{minor}"', f'#define DKS_VERSION "{major}.{minor + 1}"')
    (support / "dks.h").write_text(header)
    fixed = [source for source in support.glob("*.c") if "is invalid: expected" in source.read_text()]
    assert len(fixed) == 1, "the support library formats dks_config_error's message in one source"
    fixed[0].write_text(fixed[0].read_text().replace("is invalid: expected", "is not valid: devkit expected"))

    assert build(project, newer) == library
    assert {path: path.read_bytes() for path in files} == files, "the rebuild changed no file of the project"
    init_line, refusal = describe(library)
    assert f"(support library {major}.{minor + 1})" in init_line
    assert "is not valid: devkit expected" in refusal


# -- the example and the ABI 1.0 test plugin ---------------------------------------------


def test_the_example_is_what_the_scaffold_writes():
    """examples/vendor_plugin is `devkit new-plugin acme` as it is now, with
    no code of its own. After a change to the templates (or devkit's version
    or op set, which its README quotes), regenerate it:
    rm -r examples/vendor_plugin && devkit new-plugin acme examples/vendor_plugin."""
    for relative, text in new_plugin.render("acme").items():
        assert (EXAMPLE / relative).read_text() == text, (
            f"examples/vendor_plugin/{relative} differs from what `devkit new-plugin acme` writes; regenerate it")
    sources = {str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*") if p.suffix in (".c", ".h")}
    assert sources == VENDOR_SOURCES


def test_the_abi_1_0_plugin_gets_graphs_from_the_host(tmp_path):
    """A plugin built against devkit.h 1.0, before the graph section (the acme
    example as it was then): it loads, and the graph suite passes on it
    through the host's replay."""
    assert "#define DK_ABI_MINOR 0" in (ABI_1_0_PLUGIN / "include" / "devkit.h").read_text()
    library = tmp_path / "libdevkit_acme.so"
    sources = sorted(str(p) for p in (ABI_1_0_PLUGIN / "src").rglob("*.c"))
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O1", "-pthread", "-fPIC", "-shared",
                    "-fvisibility=hidden", f"-I{ABI_1_0_PLUGIN / 'include'}", f"-I{ABI_1_0_PLUGIN / 'src'}",
                    *sources, "-o", str(library), "-lm"], check=True)
    loaded = run_python(f"import devkit; p = devkit.load_plugin({str(library)!r}); "
                        f"print(p.abi_version, p.has_graphs)")
    assert loaded.stdout.strip() == "(1, 0) False", loaded.stderr
    result = subprocess.run([sys.executable, "-m", "devkit.conformance_cli", str(library), "--suite",
                             "graphs", "--json", str(tmp_path / "graphs.json")],
                            capture_output=True, text=True, timeout=300, env=environment())
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    cases = json.loads((tmp_path / "graphs.json").read_text())["cases"]
    passed = [c["id"] for c in cases if c["status"] == "passed"]
    assert any("test_rebind_inputs_and_outputs[host" in case for case in passed)

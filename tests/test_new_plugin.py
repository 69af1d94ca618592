"""``devkit new-plugin``: the project it writes builds warning-free, loads, and
passes the runtime and robustness conformance suites (its launcher and example
kernel refuse malformed calls); bad names and occupied directories are refused."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from devkit import cli, new_plugin
from devkit.abi import HEADER_PATH

from tests.conftest import run_python

NAME = "tpu"
EXAMPLE = Path(__file__).parent.parent / "examples" / "vendor_plugin"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("new-plugin") / f"devkit-plugin-{NAME}"
    assert cli.main(["new-plugin", NAME, str(directory)]) == 0
    return directory


def c_sources(project: Path) -> dict[str, str]:
    return {str(path.relative_to(project)): path.read_text()
            for path in sorted((project / "src").rglob("*")) if path.suffix in (".c", ".h")}


# -- names and directories ------------------------------------------------------------


@pytest.mark.parametrize("name", ["Acme", "1acme", "acme-npu", "acme npu", "_acme", "", "cpu"])
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
    assert (tmp_path / "devkit-plugin-myaccel" / "src" / "myaccel_internal.h").exists()


# -- what it writes ---------------------------------------------------------------------


def test_the_project_has_its_files(project):
    expected = {"include/devkit.h", "src/plugin.c", f"src/{NAME}_internal.h", "src/runtime.c",
                "src/stream.c", "src/kernel.h", "src/kernel.c", "src/threads.c", "src/graph.c", "src/kernels/relu.c",
                f"src/devkit_plugin_{NAME}/__init__.py", "setup.py", "pyproject.toml", "MANIFEST.in",
                "README.md", ".github/workflows/conformance.yml", ".gitignore"}
    assert {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()} == expected
    assert (project / "include" / "devkit.h").read_text() == HEADER_PATH.read_text()


def test_sources_are_renamed_without_defects_or_collectives(project):
    collectives = re.compile(rf"\b{NAME}_(?:{'|'.join(new_plugin.COLLECTIVE_FUNCTIONS)})\b|\bDK_Comm\b")
    for path, text in c_sources(project).items():
        cpu = re.search(rf"{new_plugin.CPU_PREFIX_LOWER}|{new_plugin.CPU_PREFIX_UPPER}|\bcpu\b|DEVKIT_CPU_|DEVKIT_BACKENDS_CPU", text)
        assert cpu is None, f"{path} still says {cpu.group(0)!r}"
        assert "DEVKIT_DEFECT" not in text, path
        assert collectives.search(text) is None, path
    assert f'#include "{NAME}_internal.h"' in c_sources(project)["src/runtime.c"]


def test_pyproject_registers_the_entry_point(project):
    whole = tomllib.loads((project / "pyproject.toml").read_text())
    assert whole["build-system"]["requires"] == ["setuptools>=61"]  # a default venv's 65 suffices
    assert "tool" not in whole
    pyproject = whole["project"]
    assert pyproject["name"] == f"devkit-plugin-{NAME}"
    assert any(re.match(r"devkit\b", dependency) for dependency in pyproject["dependencies"])
    assert pyproject["entry-points"]["devkit.plugins"] == {NAME: f"devkit_plugin_{NAME}:library_path"}


@pytest.fixture(params=["generated", "example"])
def any_project(request, project) -> Path:
    """The freshly generated project, and the acme example developed from one."""
    return project if request.param == "generated" else EXAMPLE


def test_readme_lists_the_variables_the_runtime_reads(any_project):
    read = set(re.findall(r'\benv\("(\w+)"\)', (any_project / "src" / "runtime.c").read_text()))
    listed = set(re.findall(r"^\| `(\w+)` \|", (any_project / "README.md").read_text(), re.M))
    assert read and read == listed


def test_sources_compile_without_warnings(any_project, tmp_path):
    sources = sorted(str(p) for p in (any_project / "src").rglob("*.c"))
    command = [os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread",
               "-fPIC", "-shared", "-fvisibility=hidden", f"-I{any_project / 'include'}",
               f"-I{any_project / 'src'}", *sources, "-o", str(tmp_path / "libdevkit_test.so"), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_abi_1_0_example_gets_graphs_from_the_host(tmp_path):
    """The acme example is built against devkit.h 1.0, before the graph section:
    it loads, and the graph suite passes on it through the host's replay."""
    assert "#define DK_ABI_MINOR 0" in (EXAMPLE / "include" / "devkit.h").read_text()
    library = tmp_path / "libdevkit_acme.so"
    sources = sorted(str(p) for p in (EXAMPLE / "src").rglob("*.c"))
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O1", "-pthread", "-fPIC", "-shared",
                    "-fvisibility=hidden", f"-I{EXAMPLE / 'include'}", f"-I{EXAMPLE / 'src'}", *sources,
                    "-o", str(library), "-lm"], check=True)
    loaded = run_python(f"import devkit; p = devkit.load_plugin({str(library)!r}); "
                        f"print(p.abi_version, p.has_graphs)")
    assert loaded.stdout.strip() == "(1, 0) False", loaded.stderr
    result = subprocess.run([sys.executable, "-m", "devkit.conformance_cli", str(library), "--suite",
                             "graphs", "--json", str(tmp_path / "graphs.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    cases = json.loads((tmp_path / "graphs.json").read_text())["cases"]
    passed = [c["id"] for c in cases if c["status"] == "passed"]
    assert any("test_rebind_inputs_and_outputs[host" in case for case in passed)


def workflow_command(project: Path) -> list[str]:
    lines = [line.strip() for line in (project / ".github/workflows/conformance.yml").read_text().splitlines()
             if line.strip().startswith("devkit-conformance ")]
    assert len(lines) == 1, "expected one devkit-conformance command in the workflow"
    return shlex.split(lines[0])


@pytest.mark.timeout(600)
def test_built_project_loads_and_passes_the_runtime_and_robustness_suites(project):
    """Built with the project's own setup.py (not installed: the test must not touch
    the interpreter's packages), found by name through DEVKIT_PLUGIN_PATH."""
    build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=project,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "beta" not in build.stderr  # setuptools < 68 (a default venv's 65) on a [tool.setuptools] table
    package = project / "src" / f"devkit_plugin_{NAME}"

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
print(plugin.name, plugin.device_type, plugin.abi_version, plugin.kernels)
""")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split(" ", 2)[:2] == [NAME, NAME]
    assert "('Relu', 2, 32, 3)" in loaded.stdout  # float32, strided inputs and outputs

    # The robustness suite: the template's Relu kernel and the launcher refuse every malformed call.
    command = workflow_command(project)
    assert command[:6] == ["devkit-conformance", NAME, "--suite", "runtime", "--suite", "robustness"]
    (project / "reports").mkdir()
    result = subprocess.run([sys.executable, "-m", "devkit.conformance_cli", *command[1:]], cwd=project,
                            capture_output=True, text=True, timeout=540,
                            env={**os.environ, "DEVKIT_PLUGIN_PATH": str(package)})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    junit = ElementTree.parse(project / "reports" / "conformance-junit.xml").getroot()
    suites = list(junit.iter("testsuite"))
    assert sum(int(s.get("tests")) for s in suites) > 50
    assert sum(int(s.get("failures")) + int(s.get("errors")) for s in suites) == 0
    report = (project / "reports" / "conformance.md").read_text()
    assert "runtime" in report and "robustness" in report
    relu = [case for case in junit.iter("testcase") if case.get("name") == f"test_kernel_call[{NAME}-Relu/float32]"]
    assert len(relu) == 1 and not list(relu[0]), "the Relu kernel must refuse each of its malformed calls"


# -- the transformation of the cpu sources ----------------------------------------------


def test_defect_blocks_keep_their_real_branch():
    source = """a
#ifdef DEVKIT_DEFECT_X
broken
#else
#if KEEP
real
#endif
#endif
#ifndef DEVKIT_DEFECT_Y /* the leak */
free
#else
also broken
#endif
b
"""
    assert new_plugin.strip_defects(source, "t.c") == "a\n#if KEEP\nreal\n#endif\nfree\nb\n"


@pytest.mark.parametrize("source", [
    "#if defined(DEVKIT_DEFECT_X)\nbroken\n#endif\n",
    "#ifdef DEVKIT_DEFECT_X\nbroken\n#elif Y\nother\n#endif\n",
    "#ifdef DEVKIT_DEFECT_X\nbroken\n",
])
def test_defect_blocks_it_does_not_understand_are_an_error(source):
    with pytest.raises(new_plugin.NewPluginError, match="t.c"):
        new_plugin.strip_defects(source, "t.c")


def test_collective_declarations_are_left_out_with_their_comment():
    header = """DK_Status cpu_mem_free(int32_t dev, DK_Mem mem);

/* Collectives: see ccl.c. */
DK_Status cpu_ccl_comm_init(int32_t dev, int32_t nranks,
                            DK_Comm *comm);
DK_Status cpu_group_end(void);

#endif
"""
    dropped = new_plugin.drop_declarations(header, ["cpu_ccl_comm_init", "cpu_group_end"], [])
    assert dropped == "DK_Status cpu_mem_free(int32_t dev, DK_Mem mem);\n\n#endif\n"

"""devkit-conformance: crash isolation, selection, expected failures and the reports.

The crash and hang cases use tests/plugins/faulty_plugin.c: the cpu plugin with
event_elapsed_ms made to segfault and host_alloc made to hang. Runs against
the cpu plugin select a few cases with -k to stay fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

import devkit
from devkit.backends.cpu import build as cpu_build
from devkit.conformance_cli.reports import RunRecord, coverage_matrix, markdown_text
from devkit.conformance_cli.results import STATUSES, Case, CaseResult
from devkit.conformance_cli.runner import CaseRunner, collect
from devkit.conformance_cli.suites import available_suites, suite_directory
from tests.conftest import compile_plugin

FAULTY_SOURCE = Path(__file__).parent / "plugins" / "faulty_plugin.c"
# In file order: a pass, the hang, the two crashes, a pass after them.
FAULTY_SELECTION = "device_count_positive or host_alloc_roundtrip or event_elapsed or invalid_event_flags"
CPU_SELECTION = "properties_sanity or alloc_free or test_memset"


def run_cli(*args, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devkit.conformance_cli", *map(str, args)], check=False, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def statuses(report: dict) -> dict[str, str]:
    """test name (without the plugin parameter) -> status."""
    return {case["id"].split("::")[1].split("[")[0]: case["status"] for case in report["cases"]}


@pytest.fixture(scope="module")
def faulty_plugin(tmp_path_factory) -> Path:
    cpu_library = devkit.load_plugin("cpu").location
    # The delegate links OpenBLAS, which its rpaths miss where the venv has
    # scipy-openblas32 only through its base (devkit's loader retries with it
    # loaded; this plugin's own dlopen cannot): the plugin needs it itself.
    _, blas_link = cpu_build.blas()
    return compile_plugin(tmp_path_factory.mktemp("faulty"), "faulty",
                          [f'DELEGATE_LIBRARY="{cpu_library}"', "CRASH_IN=event_elapsed_ms",
                           "HANG_IN=host_alloc"], source=FAULTY_SOURCE, libraries=["dl"],
                          link_args=["-Wl,--no-as-needed", *blas_link])


@pytest.fixture(scope="module")
def faulty_run(faulty_plugin, tmp_path_factory):
    """One run against the faulty plugin, with every report written."""
    out = tmp_path_factory.mktemp("faulty-run")
    process = run_cli(faulty_plugin, "--suite", "runtime", "-k", FAULTY_SELECTION, "--case-timeout", 3,
                      "--json", out / "report.json", "--junit", out / "junit.xml",
                      "--report", out / "report.md")
    return process, out


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu-run")
    process = run_cli("cpu", "--suite", "runtime", "--profile", "quick", "-k", CPU_SELECTION,
                      "--json", out / "report.json", "--junit", out / "junit.xml",
                      "--report", out / "report.md", cwd=out)
    return process, out


# -- crash isolation ----------------------------------------------------------------------


def test_crash_and_hang_are_reported_and_the_run_goes_on(faulty_run):
    process, out = faulty_run
    assert process.returncode == 1, process.stderr
    report = json.loads((out / "report.json").read_text())
    assert statuses(report) == {
        "test_device_count_positive": "passed",
        "test_host_alloc_roundtrip": "timeout",
        "test_event_elapsed_time_is_ordered_and_measures_completion": "crashed",
        "test_event_elapsed_errors": "crashed",
        "test_invalid_event_flags": "passed",
    }
    cases = {case["id"].split("::")[1].split("[")[0]: case for case in report["cases"]}
    crashed = cases["test_event_elapsed_errors"]
    assert "SIGSEGV" in crashed["message"]
    assert "Segmentation fault" in crashed["details"]
    assert "test_event_elapsed_errors" in crashed["details"], "faulthandler names the crashing test"
    hung = cases["test_host_alloc_roundtrip"]
    assert "after 3 s" in hung["message"]
    assert "test_host_alloc_roundtrip" in hung["details"], "the hung worker's stack is dumped"
    assert 3 <= hung["duration"] < 10
    assert "CRASHED" in process.stderr and "TIMEOUT" in process.stderr


def test_junit_counts_crashes_and_timeouts_as_errors(faulty_run):
    _, out = faulty_run
    root = ElementTree.parse(out / "junit.xml").getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "runtime"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == \
        ("5", "0", "3", "0")
    error_types = sorted(error.get("type") for error in suite.iter("error"))
    assert error_types == ["crashed", "crashed", "timeout"]
    assert all(case.get("classname") == "test_runtime" for case in suite.iter("testcase"))


def test_markdown_report_lists_the_crashes(faulty_run):
    _, out = faulty_run
    text = (out / "report.md").read_text()
    assert "**FAILED**: 2 crashed, 1 timeout" in text
    failures = text.split("## Failures, crashes and timeouts", 1)[1].split("\n## ", 1)[0]
    assert failures.count("### ") == 3
    assert "test_event_elapsed_errors[libdevkit_faulty.so]`: crashed" in failures
    assert "test_host_alloc_roundtrip[libdevkit_faulty.so]`: timeout" in failures


def test_runner_reports_abort_and_exit_and_recorded_properties(tmp_path):
    """A synthetic suite: a module that does not import is an error; properties travel from
    record_property to the result; an abort and an exit inside a case are crashes; the cases
    after them still run."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_synthetic.py").write_text(
        "import os\nimport pytest\n\n"
        "def test_measured(record_property):\n"
        "    record_property('measured_error', 2.5e-7)\n"
        "    record_property('tolerance', 1e-6)\n\n"
        "def test_aborts():\n    os.abort()\n\n"
        "def test_exits():\n    os._exit(3)\n\n"
        "@pytest.mark.timeout(600)\n"
        "def test_declares_its_timeout():\n    pass\n\n"
        "def test_skips():\n    pytest.skip('not on this device')\n")
    (suite / "test_broken.py").write_text("import a_module_that_does_not_exist\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    collection = collect("cpu", suite, [suite / "test_broken.py", suite / "test_synthetic.py"], None, None,
                         workdir, 60)
    assert [case.timeout for case in collection.cases] == [None, None, None, 600.0, None]
    (broken,) = collection.errors
    assert (broken.id, broken.status, broken.suite) == ("test_broken.py", "error", "broken")
    assert "a_module_that_does_not_exist" in broken.details
    results = {r.id.split("::")[1]: r for r in CaseRunner("cpu", suite, workdir, 60).run(collection.cases)}
    assert results["test_measured"].status == "passed"
    assert (results["test_measured"].measured_error, results["test_measured"].tolerance) == (2.5e-7, 1e-6)
    assert results["test_aborts"].status == "crashed"
    assert "SIGABRT" in results["test_aborts"].message
    assert results["test_exits"].status == "crashed"
    assert "exited with status 3" in results["test_exits"].message
    assert results["test_declares_its_timeout"].status == "passed"
    assert (results["test_skips"].status, results["test_skips"].message) == ("skipped", "not on this device")


def test_a_timed_out_case_takes_the_processes_it_started_with_it(tmp_path):
    """Even a process in a session of its own, as devkit-run's ranks are."""
    suite = tmp_path / "suite"
    suite.mkdir()
    pid_file = tmp_path / "child.pid"
    (suite / "test_spawns.py").write_text(
        "import subprocess, time\n\n"
        "def test_spawns_and_hangs():\n"
        "    child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(600)\n")
    runner = CaseRunner("cpu", suite, tmp_path, case_timeout=2)
    (result,) = runner.run([Case("test_spawns.py::test_spawns_and_hangs", None)])
    assert result.status == "timeout"
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the child survived"


# -- exit statuses, selection --------------------------------------------------------------


def test_cpu_runtime_quick_passes(cpu_run):
    process, out = cpu_run
    assert process.returncode == 0, process.stdout + process.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["total"] == report["summary"]["passed"] > 0
    assert "PASSED" in process.stdout


@pytest.mark.parametrize("plugin,expected", [
    ("no-such-plugin", "no plugin named 'no-such-plugin'"),
    ("init_fails", "no accelerator found on PCI bus 3"),
])
def test_plugin_that_does_not_load_exits_2(tmp_path, plugin, expected):
    if plugin == "init_fails":
        plugin = compile_plugin(tmp_path, "init_fails", ["INIT_FAILS"])
    process = run_cli(plugin, "--suite", "runtime")
    assert process.returncode == 2
    assert "does not load" in process.stderr and expected in process.stderr


def test_list_shows_the_selected_cases_without_running_them():
    process = run_cli("cpu", "--suite", "runtime", "--list", "-k", "alloc_free")
    assert process.returncode == 0, process.stderr
    assert process.stdout.splitlines() == [f"test_runtime.py::test_alloc_free[cpu-{size}]"
                                           for size in (0, 1, 3, 4103, 1048576)]
    assert "passed" not in process.stdout


def test_quick_profile_leaves_out_the_heavy_cases():
    quick = run_cli("cpu", "--suite", "runtime", "--list", "-k", "copy_h2d_d2h").stdout.splitlines()
    full = run_cli("cpu", "--suite", "runtime", "--list", "-k", "copy_h2d_d2h", "--profile", "full")\
        .stdout.splitlines()
    heavy = [case for case in full if "67108864" in case]
    assert len(heavy) == 6 and not any("67108864" in case for case in quick)
    assert sorted(quick + heavy) == sorted(full)


def test_suites_are_the_conformance_modules():
    suites = available_suites(suite_directory())
    assert sorted(suites) == sorted(
        path.stem[len("test_"):].replace("_", "-") for path in suite_directory().glob("test_*.py"))
    assert "runtime" in suites


def test_suite_selects_its_module():
    process = run_cli("cpu", "--suite", "runtime", "--list")
    assert process.returncode == 0, process.stderr
    cases = process.stdout.splitlines()
    assert cases and all(case.startswith("test_runtime.py::") for case in cases)


def test_unknown_suite_is_an_error_listing_the_available_ones():
    process = run_cli("cpu", "--suite", "nope")
    assert process.returncode == 2
    assert "unknown suite 'nope'" in process.stderr
    assert f"available suites: {', '.join(available_suites(suite_directory()))}" in process.stderr


def test_no_selected_case_is_an_error():
    process = run_cli("cpu", "--suite", "runtime", "-k", "no_case_has_this_name")
    assert process.returncode == 2 and "no cases selected" in process.stderr


# -- expected failures -------------------------------------------------------------------------


def test_expected_failures_become_xfail_and_unexpected_passes_xpass(faulty_plugin, tmp_path):
    expect = tmp_path / "expect.txt"
    expect.write_text("# known problems of the faulty plugin\n\n"
                      "test_runtime.py::test_event_elapsed_errors[*]: event timing crashes (issue 12)\n"
                      "test_runtime.py::test_device_count_positive[*]: wrongly expected to fail\n")
    process = run_cli(faulty_plugin, "--suite", "runtime", "-k", "device_count_positive or elapsed_errors",
                      "--expect-fail", expect, "--json", tmp_path / "report.json")
    assert process.returncode == 1, process.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert statuses(report) == {"test_event_elapsed_errors": "xfail", "test_device_count_positive": "xpass"}
    expected = {case["status"]: case["expected_failure"] for case in report["cases"]}
    assert expected["xfail"] == {"pattern": "test_runtime.py::test_event_elapsed_errors[*]",
                                 "reason": "event timing crashes (issue 12)", "line": 3,
                                 "actual_status": "crashed"}
    assert expected["xpass"]["actual_status"] == "passed"


def test_only_expected_failures_exit_0(faulty_plugin, tmp_path):
    expect = tmp_path / "expect.txt"
    expect.write_text("test_runtime.py::test_event_elapsed_*: event timing crashes (issue 12)\n")
    process = run_cli(faulty_plugin, "--suite", "runtime", "-k", "device_count_positive or elapsed_errors",
                      "--expect-fail", expect)
    assert process.returncode == 0, process.stderr


@pytest.mark.parametrize("line", ["test_runtime.py::test_alloc_free[*]", "test_runtime.py::test_alloc_free[*]:",
                                  "test_runtime.py::test_alloc_free[*]:   "])
def test_expectation_without_a_reason_is_rejected(tmp_path, line):
    expect = tmp_path / "expect.txt"
    expect.write_text(f"# a comment\n{line}\n")
    process = run_cli("cpu", "--expect-fail", expect)
    assert process.returncode == 2
    assert f"{expect}:2: expected 'PATTERN: REASON' with a written reason" in process.stderr


# -- reports ---------------------------------------------------------------------------------

TOP_LEVEL = {"schema_version": int, "suite_version": str, "command": str, "profile": str, "suites": list,
             "started": str, "wall_time": float, "exit_status": int, "plugin": dict, "summary": dict,
             "incidents": list, "cases": list}
PLUGIN = {"name": str, "version": str, "abi_version": str, "device_type": str, "source": str,
          "location": str, "devices": list, "devices_error": (str, type(None)), "kernels": list,
          "resolution": list, "primitives": dict}
DEVICE = {"index": int, "name": str, "vendor": str, "driver_version": str, "device_type": str,
          "compute_units": int, "total_memory": int, "max_alloc_size": int, "alloc_alignment": int,
          "flags": list}
CASE = {"id": str, "suite": str, "status": str, "duration": float, "message": str, "details": str,
        "measured_error": (int, float, str, type(None)), "tolerance": (int, float, str, type(None)),
        "properties": dict, "expected_failure": (dict, type(None))}


def assert_fields(record: dict, schema: dict):
    assert set(record) == set(schema)
    for key, kind in schema.items():
        assert isinstance(record[key], kind), (key, record[key])


def test_json_report_follows_the_documented_schema(cpu_run):
    _, out = cpu_run
    report = json.loads((out / "report.json").read_text())
    assert_fields(report, TOP_LEVEL)
    assert report["schema_version"] == 1 and report["suite_version"] == devkit.__version__
    assert report["command"].startswith("devkit-conformance cpu --suite runtime --profile quick")
    assert_fields(report["plugin"], PLUGIN)
    assert report["plugin"]["abi_version"] == f"{devkit.ABI_MAJOR}.{devkit.ABI_MINOR}"
    assert len(report["plugin"]["devices"]) == devkit.load_plugin("cpu").device_count
    for device in report["plugin"]["devices"]:
        assert_fields(device, DEVICE)
    assert set(report["summary"]) == {"total", *STATUSES, "suites"}
    assert set(report["summary"]["suites"]) == {"runtime"}
    for case in report["cases"]:
        assert_fields(case, CASE)
        assert case["status"] in STATUSES and case["suite"] == "runtime"
    # The documented fields are the ones docs/conformance.md lists.
    docs = (Path(__file__).parents[1] / "docs" / "conformance.md").read_text()
    for field in {*TOP_LEVEL, *PLUGIN, *DEVICE, *CASE}:
        assert f"`{field}`" in docs, f"docs/conformance.md does not document {field}"


def test_junit_report_parses_with_the_right_counts(cpu_run):
    _, out = cpu_run
    report = json.loads((out / "report.json").read_text())
    root = ElementTree.parse(out / "junit.xml").getroot()
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "runtime"
    assert int(suite.get("tests")) == len(suite.findall("testcase")) == report["summary"]["total"]
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("0", "0", "0")


def test_markdown_report_has_every_section(cpu_run):
    _, out = cpu_run
    text = (out / "report.md").read_text()
    for heading in ("# devkit conformance report: cpu", "## Summary", "## Plugin and devices",
                    "## Kernel coverage (op × dtype)", "## Measured errors", "## CPU fallbacks",
                    "## Failures, crashes and timeouts", "## Expected failures", "## Skipped"):
        assert heading in text
    assert "**PASSED**" in text
    kernels = len(devkit.load_plugin("cpu").kernels)
    assert f"{kernels} kernels in the plugin's kernel table" in text
    assert "| Conv |  |  |  |  |  | ✓ | ✓ | ✓ | ✓ |" in text  # the four float dtypes only
    assert "| 1 | devkit cpu device 1 |" in text


def test_coverage_matrix_and_measured_errors_in_markdown():
    kernels = [{"op": "Add", "dtype": "float32", "flags": ["strided_inputs"]},
               {"op": "Add", "dtype": "float16", "flags": []},
               {"op": "Relu", "dtype": "float32", "flags": []}]
    assert coverage_matrix(kernels).splitlines() == [
        "| op | float16 | float32 |", "|---|---|---|", "| Add | ✓ | ✓ (si) |", "| Relu |  | ✓ |"]
    plugin = {"name": "p", "version": "1", "abi_version": "1.0", "device_type": "x", "source": "path",
              "location": "/p.so", "devices": [], "devices_error": None, "kernels": kernels}
    results = [CaseResult("test_ops.py::test_add[p-float16]", "passed", 0.1,
                          properties={"measured_error": 3e-4, "tolerance": 1e-3})]
    text = markdown_text(RunRecord(plugin, "devkit-conformance p", "quick", ["ops"], "now", 1.0, results, []))
    assert "| `test_ops.py::test_add[p-float16]` | passed | 0.0003 | 0.001 |" in text
    assert "3 kernels in the plugin's kernel table" in text


def test_a_case_belongs_to_the_suite_its_module_names():
    assert Case("test_onnx_node.py::test_x[cpu]", None).suite == "onnx-node"


def test_unclaimed_kernels_skip_and_cpu_fallback_runs_them_counted_in_the_reports(tmp_path):
    bare = cpu_build.build(tmp_path / "bare", kernels=[], name="bare")  # a plugin without kernels
    selection = ["--suite", "onnx-node", "-k", "test_add and not bcast and not int and not uint"]
    unclaimed = run_cli(bare, *selection, "--json", tmp_path / "unclaimed.json")
    assert unclaimed.returncode == 0, unclaimed.stdout + unclaimed.stderr
    skipped = json.loads((tmp_path / "unclaimed.json").read_text())["cases"][0]
    assert skipped["status"] == "skipped"
    assert "not claimed by the plugin" in skipped["message"]
    assert "has no kernel for dtype float32" in skipped["message"]

    allowed = run_cli(bare, *selection, "--allow-cpu-fallback", "--json", tmp_path / "run.json",
                      "--report", tmp_path / "report.md")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    case = json.loads((tmp_path / "run.json").read_text())["cases"][0]
    assert case["status"] == "passed"
    assert case["properties"]["fallbacks"] == {"Add[float32]": 1}
    report = (tmp_path / "report.md").read_text()
    assert "## CPU fallbacks" in report and "| Add[float32] | 1 | 1 |" in report


def test_a_case_reports_progress_inside_itself(tmp_path):
    """The collectives matrix runs as one batch; its case says how far it got (progress.py)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_batch.py").write_text(
        "import subprocess, sys\n"
        "from devkit.conformance_cli.progress import report_progress\n\n"
        "def test_batch():\n"
        "    for done in (1, 2, 3):\n"
        "        report_progress(done, 3, f'step{done}')\n"
        "    # a process the case starts inherits the variable, not the pipe: it reports nothing\n"
        "    subprocess.run([sys.executable, '-c', 'from devkit.conformance_cli.progress import report_progress; '\n"
        "                    'report_progress(9, 9)'], check=True)\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    collection = collect("cpu", suite, [suite / "test_batch.py"], None, None, workdir, 60)
    events = []
    runner = CaseRunner("cpu", suite, workdir, 60, on_progress=lambda case, event: events.append((case.id, event)))
    (result,) = runner.run(collection.cases)
    assert result.status == "passed", result.details
    assert events == [("test_batch.py::test_batch", {"event": "progress", "done": done, "total": 3,
                                                     "current": f"step{done}"}) for done in (1, 2, 3)]


def test_report_progress_outside_a_worker_does_nothing(monkeypatch):
    from devkit.conformance_cli import progress

    monkeypatch.delenv(progress.ENVIRONMENT_VARIABLE, raising=False)
    progress.report_progress(1, 2, "no worker")  # no pipe, no error
    monkeypatch.setenv(progress.ENVIRONMENT_VARIABLE, "1:999")  # another process's pipe
    progress.report_progress(1, 2, "not mine")


def test_start_up_and_eta_are_shown(cpu_run):
    process, _ = cpu_run
    assert process.stderr.startswith("devkit-conformance: loading plugin 'cpu' and collecting the cases of "
                                     "runtime (profile quick) in a worker...\n")
    assert " eta " in process.stderr


def test_near_identical_skip_reasons_are_one_row():
    results = [CaseResult(f"test_ops.py::test_op[{op}-{dtype}]", "skipped",
                          message=f"plugin 'acme' has no {op} kernel for {dtype} (not claimed)")
               for op in ("Add", "Mul", "Relu") for dtype in ("float16", "int8")]
    results += [CaseResult("test_runtime.py::test_pair", "skipped",
                           message="plugin 'acme' has one device; this case needs two"),
                CaseResult("test_onnx_node.py::test_a", "skipped",
                           message="outside devkit's dtype set: 'x': element type FLOAT8E4M3FN is not a devkit dtype"),
                CaseResult("test_onnx_node.py::test_b", "skipped",
                           message="outside devkit's dtype set: 'y': element type STRING is not a devkit dtype")]
    run = RunRecord(plugin={"name": "acme", "version": "1.0", "abi_version": "1.0", "device_type": "cpu",
                            "source": "entry point", "location": "/x.so", "devices": [], "devices_error": None,
                            "kernels": []},
                    command="devkit-conformance acme", profile="quick", suites=["ops"], started="now",
                    wall_time=1.0, results=results, incidents=[])
    section = markdown_text(run).split("## Skipped\n\n", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Reason")]
    assert rows == [
        "| plugin … has no … kernel for … (not claimed) | 6 | plugin 'acme' has no Add kernel for float16 "
        "(not claimed); plugin 'acme' has no Add kernel for int8 (not claimed); plugin 'acme' has no Mul kernel "
        "for float16 (not claimed) ... |",
        "| outside devkit's dtype set: …: element type … is not a devkit dtype | 2 | outside devkit's dtype set: "
        "'x': element type FLOAT8E4M3FN is not a devkit dtype; outside devkit's dtype set: 'y': element type "
        "STRING is not a devkit dtype |",
        "| plugin 'acme' has one device; this case needs two | 1 |  |",
    ]


def test_the_suite_defaults_to_the_built_in_plugins(monkeypatch):
    """Vendor plugins installed beside devkit are left out of `pytest` unless named (or `all`)."""
    from conformance import conftest

    def descriptor(name, source, loads=True):
        return devkit.PluginDescriptor(name, source, f"/{name}", loads, (1, 0), "1", 1, None)

    listed = [descriptor("cpu", "built-in"), descriptor("opencl", "built-in", loads=False),
              descriptor("acme", "entry point"), descriptor("mine", "DEVKIT_PLUGIN_PATH")]
    monkeypatch.setattr(devkit, "list_plugins", lambda: listed)
    monkeypatch.delenv("DEVKIT_TEST_PLUGINS", raising=False)
    assert conftest.selected_plugins() == ["cpu"]
    monkeypatch.setenv("DEVKIT_TEST_PLUGINS", "all")
    assert conftest.selected_plugins() == ["cpu", "acme", "mine"]
    monkeypatch.setenv("DEVKIT_TEST_PLUGINS", " acme, /x/libdevkit_y.so ")
    assert conftest.selected_plugins() == ["acme", "/x/libdevkit_y.so"]


def test_coverage_matrix_marks_native_and_decomposed_apart():
    kernels = [{"op": "Add", "dtype": "float32", "flags": []}]
    resolution = [{"op": "Add", "dtype": "float32", "how": "native"},
                  {"op": "Sub", "dtype": "float32", "how": "decomposed"},
                  {"op": "Conv", "dtype": "float32", "how": "unsupported"}]
    assert coverage_matrix(kernels, resolution).splitlines() == [
        "| op | float32 |", "|---|---|", "| Add | ✓ |", "| Conv |  |", "| Sub | dec |"]


REQUIRE_SELECTION = ["--suite", "ops", "-k", "test_op and Softmax-float32-default_axis and not strided"]


def test_require_native_passes_on_native_kernels_and_fails_on_decomposed_ones(tmp_path):
    native = run_cli("cpu", *REQUIRE_SELECTION, "--require-native", "Add,Softmax[float32]")
    assert native.returncode == 0, native.stdout + native.stderr
    assert "primitives: 29/29 at every dtype" in native.stdout
    env = {**os.environ, "DEVKIT_CPU_KERNELS": "primitives"}
    decomposed = subprocess.run([sys.executable, "-m", "devkit.conformance_cli", "cpu", *REQUIRE_SELECTION,
                                 "--require-native", "Add,Softmax[float32]", "--report", tmp_path / "r.md"],
                                env=env, capture_output=True, text=True, timeout=300)
    assert decomposed.returncode == 1, decomposed.stdout + decomposed.stderr
    output = " ".join((decomposed.stdout + decomposed.stderr).split())
    assert "--require-native: not native on cpu: Softmax[float32]" in output
    assert "decomposition unlocks" in decomposed.stdout
    report = (tmp_path / "r.md").read_text()
    assert "| Softmax |  |  |  |  |  | dec | dec | dec | dec |" in report
    assert "; dec: no kernel, runs decomposed" in report


def test_require_native_names_an_unknown_op():
    process = run_cli("cpu", *REQUIRE_SELECTION, "--require-native", "Frobnicate")
    assert process.returncode == 2
    assert "--require-native: op 'Frobnicate' is not in the devkit operator set" in process.stderr

"""The worker process: runs pytest in-process on the suite and streams events.

    python -m devkit.conformance_cli.worker --event-fd FD --suite-dir DIR collect FILE... [-k EXPR] [-m EXPR]
    python -m devkit.conformance_cli.worker --event-fd FD --suite-dir DIR run CASES_JSON

The plugin under test is DEVKIT_TEST_PLUGINS, as for the suite itself. Each
event is one JSON line written to FD:

    collect: {"event": "plugin", "plugin": {...}} or {"event": "load_error", "message": str},
             then {"event": "collected", "cases": [{"id", "timeout"}], "errors": [{"id", "message"}]}
    run:     {"event": "started", "id"} and, unless the process dies first,
             {"event": "finished", "id", "status", "message", "details", "properties"};
             between them, from a case with a long batch (progress.py),
             {"event": "progress", "done", "total", "current"}

A case is "started" before its setup, so the parent knows which case was
running when a worker crashed or hung.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

import devkit
from devkit.abi import ffi
from devkit.ops import all_specs, resolution
from devkit.ops.spec import dtype_name as spec_dtype_name

from . import progress


class CaseCollector:
    """pytest plugin for collect mode: reports the selected cases and the modules that failed to import."""

    def __init__(self, emit):
        self._emit = emit
        self._errors: list[dict] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self._errors.append({"id": report.nodeid, "message": report.longreprtext})

    def pytest_collection_finish(self, session):
        cases = [{"id": item.nodeid, "timeout": declared_timeout(item)} for item in session.items]
        self._emit({"event": "collected", "cases": cases, "errors": self._errors})


class CaseReporter:
    """pytest plugin for run mode: runs only the given cases and reports each one."""

    def __init__(self, emit, case_ids: set[str]):
        self._emit = emit
        self._case_ids = case_ids
        self._reports: dict[str, list] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        dropped = [item for item in items if item.nodeid not in self._case_ids]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item.nodeid in self._case_ids]

    def pytest_runtest_logstart(self, nodeid, location):
        self._emit({"event": "started", "id": nodeid})

    def pytest_runtest_logreport(self, report):
        self._reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        outcome = case_outcome(self._reports.pop(nodeid, []))
        fallbacks = _drain_fallbacks()
        if fallbacks:
            outcome["properties"]["fallbacks"] = fallbacks
        self._emit({"event": "finished", "id": nodeid, **outcome})


def _drain_fallbacks() -> dict[str, int]:
    """Ops the case ran on the cpu plugin instead (--allow-cpu-fallback), as "op[dtype]" -> count."""
    return {f"{row['op']}[{row['dtype']}]": row["count"] for row in devkit.fallback_report(reset=True)}


def declared_timeout(item) -> float | None:
    """The case's own limit, from pytest-timeout's marker: @pytest.mark.timeout(seconds)."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    seconds = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    return float(seconds) if seconds else None


def case_outcome(reports) -> dict:
    """Status, message, details and recorded properties of one case, from its phase reports."""
    properties = {}
    for report in reports:
        properties.update({name: _jsonable(value) for name, value in report.user_properties})
    outcome = {"status": "passed", "message": "", "details": "", "properties": properties}
    failed = next((report for report in reports if report.failed), None)
    skipped = next((report for report in reports if report.skipped), None)
    call = next((report for report in reports if report.when == "call"), None)
    if failed is not None:
        in_call = failed.when == "call"
        message = _failure_message(failed)
        outcome.update(status="failed" if in_call else "error",
                       message=message if in_call else f"error in {failed.when}: {message}",
                       details=_details(failed))
    elif skipped is not None and hasattr(skipped, "wasxfail"):
        outcome.update(status="xfail", message=f"expected to fail: {skipped.wasxfail or '(no reason given)'}")
    elif skipped is not None:
        outcome.update(status="skipped", message=_skip_reason(skipped))
    elif call is not None and hasattr(call, "wasxfail"):
        outcome.update(status="xpass", message=f"passed, but marked xfail: {call.wasxfail or '(no reason given)'}")
    return outcome


def _failure_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    lines = report.longreprtext.strip().splitlines()
    return lines[-1] if lines else "failed"


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ").strip() or "(no reason given)"


def _details(report) -> str:
    sections = [f"--- {title} ---\n{content}" for title, content in report.sections]
    return "\n".join([report.longreprtext, *sections])


def _jsonable(value):
    """record_property values as JSON: numbers stay numbers (NumPy scalars too), the rest as str."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        return value.item()  # a NumPy scalar or 0-d array
    except (AttributeError, ValueError):
        return str(value)


# -- the plugin under test ------------------------------------------------------------


def describe_plugin(name: str) -> dict:
    """Identity, devices and kernel table of the plugin, for the reports."""
    plugin = devkit.load_plugin(name)
    major, minor = plugin.abi_version
    description = {
        "name": plugin.name, "version": plugin.version, "abi_version": f"{major}.{minor}",
        "device_type": plugin.device_type, "source": plugin.source, "location": plugin.location,
        "devices": [], "devices_error": None,
        "kernels": [{"op": op, "dtype": dtype_name(code, bits),
                     "flags": _flag_names(flags, "DK_KernelFlags", "DK_KERNEL_")}
                    for op, code, bits, flags in plugin.kernels],
        **describe_resolution(plugin),
    }
    try:
        description["devices"] = [describe_device(device) for device in plugin.devices()]
    except devkit.DevkitError as exc:  # the report still names the plugin; the cases say what is wrong
        description["devices_error"] = str(exc)
    return description


def describe_resolution(plugin) -> dict:
    """How every (op, dtype) of the op set runs on the plugin (native,
    decomposed or unsupported: the report counts fallback apart), and what its
    primitive kernels give it."""
    plans = [resolution.resolve(plugin, spec.name, d) for spec in all_specs() for d in spec.dtypes]
    return {"resolution": [{"op": p.op, "dtype": spec_dtype_name(p.dtype), "how": p.how} for p in plans],
            "primitives": resolution.primitive_summary(plugin)}


def describe_device(device) -> dict:
    properties = dataclasses.asdict(device.properties)
    device_types = ffi.typeof("enum DK_DeviceType").elements
    properties["device_type"] = device_types.get(properties["device_type"], "DK_DEVICE_TYPE_?")\
        .removeprefix("DK_DEVICE_TYPE_").lower()
    properties["flags"] = _flag_names(properties["flags"], "DK_DeviceFlags", "DK_DEVICE_")
    return {"index": device.index, **properties}


def dtype_name(code: int, bits: int) -> str:
    kind = ffi.typeof("enum DK_DataTypeCode").elements.get(code, f"CODE{code}_").removeprefix("DK_DTYPE_CODE_")
    return "bool" if kind == "BOOL" else f"{kind.lower()}{bits}"


def _flag_names(flags: int, enum: str, prefix: str) -> list[str]:
    names = ffi.typeof(f"enum {enum}").elements
    return [names[bit].removeprefix(prefix).lower() for bit in sorted(names) if flags & bit]


# -- main -------------------------------------------------------------------------------


def _event_writer(fd: int):
    stream = os.fdopen(fd, "w", encoding="utf-8")

    def emit(event: dict):
        # allow_nan: a measured error may be NaN; the parent's json reads it back.
        stream.write(json.dumps(event, allow_nan=True) + "\n")
        stream.flush()

    return emit


def _pytest_arguments(suite_dir: Path, files: list[str]) -> list[str]:
    # -c os.devnull: the suite behaves the same wherever it is installed, whatever
    # pytest configuration lies around it. --rootdir makes case ids relative to it.
    return [*files, "--rootdir", str(suite_dir), "-c", os.devnull, "-p", "no:cacheprovider",
            "--tb=short", "-q"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devkit.conformance_cli.worker")
    parser.add_argument("--event-fd", type=int, required=True)
    parser.add_argument("--suite-dir", type=Path, required=True)
    modes = parser.add_subparsers(dest="mode", required=True)
    collect = modes.add_parser("collect")
    collect.add_argument("files", nargs="+")
    collect.add_argument("-k", dest="keyword")
    collect.add_argument("-m", dest="markers")
    run = modes.add_parser("run")
    run.add_argument("cases", type=Path, help="JSON list of case ids")
    args = parser.parse_args(argv)
    emit = _event_writer(args.event_fd)

    if args.mode == "collect":
        try:
            emit({"event": "plugin", "plugin": describe_plugin(os.environ["DEVKIT_TEST_PLUGINS"])})
        except Exception as exc:  # whatever stops it loading is the answer, not a worker failure
            emit({"event": "load_error", "message": str(exc) or type(exc).__name__})
            return 0
        arguments = _pytest_arguments(args.suite_dir, args.files) + ["--collect-only"]
        arguments += ["-k", args.keyword] if args.keyword else []
        arguments += ["-m", args.markers] if args.markers else []
        pytest.main(arguments, plugins=[CaseCollector(emit)])
        return 0

    progress.advertise(args.event_fd)
    case_ids = json.loads(args.cases.read_text())
    files = sorted({case_id.split("::", 1)[0] for case_id in case_ids})
    arguments = _pytest_arguments(args.suite_dir, [str(args.suite_dir / name) for name in files])
    return int(pytest.main(arguments + ["--continue-on-collection-errors"],
                           plugins=[CaseReporter(emit, set(case_ids))]))


if __name__ == "__main__":
    sys.exit(main())

"""The run's reports: JSON (--json), JUnit XML (--junit) and Markdown (--report).

docs/conformance.md documents the JSON schema.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from xml.etree import ElementTree

import devkit

from .results import STATUSES, CaseResult, succeeded, summarize

JSON_SCHEMA_VERSION = 1


@dataclasses.dataclass
class RunRecord:
    plugin: dict             # worker.describe_plugin(): identity, devices, kernels
    command: str
    profile: str
    suites: list[str]
    started: str             # ISO 8601, UTC
    wall_time: float
    results: list[CaseResult]
    incidents: list[str]     # failures outside any case

    @property
    def passed(self) -> bool:
        return succeeded(self.results)


def write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# -- JSON --------------------------------------------------------------------------------


def to_json(run: RunRecord) -> dict:
    summaries = summarize(run.results)
    totals = {status: sum(s.counts[status] for s in summaries) for status in STATUSES}
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "suite_version": devkit.__version__,
        "command": run.command,
        "profile": run.profile,
        "suites": run.suites,
        "started": run.started,
        "wall_time": round(run.wall_time, 3),
        "exit_status": 0 if run.passed else 1,
        "plugin": run.plugin,
        "summary": {
            "total": len(run.results), **totals,
            "suites": {s.suite: {"total": s.total, **s.counts, "wall_time": round(s.wall_time, 3)}
                       for s in summaries},
        },
        "incidents": run.incidents,
        "cases": [_case_json(result) for result in run.results],
    }


def _case_json(result: CaseResult) -> dict:
    expectation = result.expectation
    return {
        "id": result.id,
        "suite": result.suite,
        "status": result.status,
        "duration": round(result.duration, 4),
        "message": result.message,
        "details": result.details,
        "measured_error": _finite(result.measured_error),
        "tolerance": _finite(result.tolerance),
        "properties": {name: _finite(value) for name, value in result.properties.items()},
        "expected_failure": None if expectation is None else {
            "pattern": expectation.pattern, "reason": expectation.reason, "line": expectation.line,
            "actual_status": result.actual_status},
    }


def _finite(value):
    """NaN and infinities as the strings "nan", "inf", "-inf": strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def json_text(run: RunRecord) -> str:
    return json.dumps(to_json(run), indent=2, allow_nan=False) + "\n"


# -- JUnit XML ---------------------------------------------------------------------------

_FAILURE_TYPES = {"failed", "xpass"}
_ERROR_TYPES = {"error", "crashed", "timeout"}
_SKIPPED_TYPES = {"skipped", "xfail"}
# Characters XML 1.0 cannot carry (a crashed worker's log may hold some).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text) -> str:
    return _NOT_XML.sub("\ufffd", str(text))


def to_junit(run: RunRecord) -> ElementTree.ElementTree:
    """testsuites > testsuite per suite > testcase; crashed and timeout are <error type=...>."""
    plugin = run.plugin
    root = ElementTree.Element("testsuites", name=f"devkit-conformance {plugin['name']}",
                               time=f"{run.wall_time:.3f}")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for summary in summarize(run.results):
        counts = {"tests": summary.total,
                  "failures": sum(summary.counts[s] for s in _FAILURE_TYPES),
                  "errors": sum(summary.counts[s] for s in _ERROR_TYPES),
                  "skipped": sum(summary.counts[s] for s in _SKIPPED_TYPES)}
        suite = ElementTree.SubElement(root, "testsuite", name=summary.suite, timestamp=run.started,
                                       time=f"{summary.wall_time:.3f}",
                                       **{key: str(value) for key, value in counts.items()})
        properties = ElementTree.SubElement(suite, "properties")
        for name, value in [("plugin", plugin["name"]), ("plugin_version", plugin["version"]),
                            ("abi_version", plugin["abi_version"]), ("suite_version", devkit.__version__),
                            ("profile", run.profile)]:
            ElementTree.SubElement(properties, "property", name=name, value=_xml_text(value))
        for result in run.results:
            if result.suite == summary.suite:
                _junit_case(suite, result)
        for key in totals:
            totals[key] += counts[key]
    root.attrib.update({key: str(value) for key, value in totals.items()})
    ElementTree.indent(root)
    return ElementTree.ElementTree(root)


def _junit_case(suite: ElementTree.Element, result: CaseResult):
    module, _, name = result.id.partition("::")
    case = ElementTree.SubElement(suite, "testcase", classname=Path(module).stem, name=_xml_text(name or module),
                                  time=f"{result.duration:.4f}")
    if result.properties:
        properties = ElementTree.SubElement(case, "properties")
        for name, value in result.properties.items():
            ElementTree.SubElement(properties, "property", name=_xml_text(name), value=_xml_text(value))
    message = _xml_text(_message_with_expectation(result))
    if result.status in _FAILURE_TYPES:
        ElementTree.SubElement(case, "failure", type=result.status, message=message).text = _xml_text(result.details)
    elif result.status in _ERROR_TYPES:
        ElementTree.SubElement(case, "error", type=result.status, message=message).text = _xml_text(result.details)
    elif result.status in _SKIPPED_TYPES:
        ElementTree.SubElement(case, "skipped", type=result.status, message=message)


def _message_with_expectation(result: CaseResult) -> str:
    if result.status == "xfail" and result.expectation is not None:
        return (f"expected failure ({result.actual_status}): {result.expectation.reason}; "
                f"{result.message}")
    return result.message


def junit_text(run: RunRecord) -> str:
    return ElementTree.tostring(to_junit(run).getroot(), encoding="unicode", xml_declaration=True) + "\n"


# -- Markdown ----------------------------------------------------------------------------

_UNSUCCESSFUL_ORDER = ("crashed", "timeout", "error", "failed", "xpass")
_DETAILS_LIMIT = 4000  # characters of details shown per case; the JSON has them whole


def markdown_text(run: RunRecord) -> str:
    plugin = run.plugin
    sections = [
        f"# devkit conformance report: {plugin['name']} {plugin['version']}".rstrip(),
        _verdict(run),
        _summary_section(run),
        _plugin_section(plugin),
        _coverage_section(plugin["kernels"], plugin.get("resolution"), plugin.get("primitives")),
        _measured_errors_section(run.results),
        _fallback_section(run.results),
        _failures_section(run.results),
        _expected_failures_section(run.results),
        _skipped_section(run.results),
    ]
    if run.incidents:
        sections.append("## Incidents outside any case\n\n" + "\n\n".join(
            f"```\n{incident}\n```" for incident in run.incidents))
    return "\n\n".join(sections) + "\n"


def _verdict(run: RunRecord) -> str:
    counts = {status: sum(1 for r in run.results if r.status == status) for status in STATUSES}
    bad = [f"{counts[s]} {s}" for s in _UNSUCCESSFUL_ORDER if counts[s]]
    verdict = "**PASSED**" if run.passed else f"**FAILED**: {', '.join(bad)}"
    return (f"{verdict} — {len(run.results)} cases, profile `{run.profile}`, suites: "
            f"{', '.join(run.suites)}.\n\n"
            f"Command: `{run.command}`  \n"
            f"Suite version: devkit {devkit.__version__}; started {run.started}; "
            f"wall time {run.wall_time:.1f} s.")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _summary_section(run: RunRecord) -> str:
    summaries = summarize(run.results)
    rows = [[s.suite, s.total, *(s.counts[status] for status in STATUSES), f"{s.wall_time:.1f} s"]
            for s in summaries]
    rows.append(["**total**", len(run.results),
                 *(sum(s.counts[status] for s in summaries) for status in STATUSES),
                 f"{run.wall_time:.1f} s"])
    return "## Summary\n\n" + _table(["Suite", "Cases", *STATUSES, "Wall time"], rows)


def _plugin_section(plugin: dict) -> str:
    identity = _table(["", ""], [
        ["Name", plugin["name"]], ["Version", plugin["version"] or "(not given)"],
        ["ABI version", plugin["abi_version"]], ["Device type", plugin["device_type"]],
        ["Library", f"`{plugin['location']}` ({plugin['source']})"]])
    if plugin["devices_error"]:
        devices = f"The devices could not be listed: {plugin['devices_error']}"
    else:
        devices = _table(
            ["#", "Name", "Vendor", "Driver", "Type", "Compute units", "Memory", "Max allocation",
             "Alignment", "Flags"],
            [[d["index"], d["name"], d["vendor"], d["driver_version"], d["device_type"],
              d["compute_units"], _bytes(d["total_memory"]), _bytes(d["max_alloc_size"]),
              d["alloc_alignment"], ", ".join(d["flags"]) or "none"] for d in plugin["devices"]])
    return f"## Plugin and devices\n\n{identity}\n\n{devices}"


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:g} {unit}"
    return f"{count} B"


def coverage_matrix(kernels: list[dict], resolution: list[dict] | None = None) -> str:
    """op x dtype: ✓ where the kernel table has an entry, with its flags' initials
    (si/so); given the resolution of the op set, every op, and "dec" where the
    op runs decomposed into the plugin's kernels."""
    cells = {(k["op"], k["dtype"]): "✓" + (f" ({', '.join(_initials(f) for f in k['flags'])})"
                                            if k["flags"] else "") for k in kernels}
    pairs = [(k["op"], k["dtype"]) for k in kernels]
    for r in resolution or ():
        pairs.append((r["op"], r["dtype"]))
        if r["how"] == "decomposed":
            cells.setdefault((r["op"], r["dtype"]), "dec")
    ops = sorted({op for op, _ in pairs})
    dtypes = sorted({dtype for _, dtype in pairs}, key=_dtype_order)
    return _table(["op", *dtypes], [[op, *(cells.get((op, dtype), "") for dtype in dtypes)] for op in ops])


def primitives_line(primitives: dict, resolution: list[dict]) -> str:
    """How many primitives the plugin has and what they unlock (the ops that run decomposed)."""
    unlocked = sorted({r["op"] for r in resolution if r["how"] == "decomposed"})
    have, total = len(primitives["primitives"]), len(primitives["primitives"]) + len(primitives["missing"])
    line = (f"primitives: {have}/{total} at every dtype"
            + (f" (missing: {', '.join(primitives['missing'])})" if primitives["missing"] else "")
            + f"; {primitives['native']} (op, dtype) pairs native, {primitives['decomposed']} decomposed, "
            f"{primitives['pairs'] - primitives['native'] - primitives['decomposed']} unsupported "
            f"of {primitives['pairs']}")
    if unlocked:
        line += f"; decomposition unlocks {len(unlocked)} ops: {', '.join(unlocked)}"
    return line


def _dtype_order(name: str):
    kind = name.rstrip("0123456789")
    order = ("bool", "int", "uint", "float", "bfloat", "complex")
    return (order.index(kind) if kind in order else len(order), int(name[len(kind):] or 0), name)


def _initials(flag: str) -> str:
    return "".join(word[0] for word in flag.split("_"))


def _coverage_section(kernels: list[dict], resolution: list[dict] | None = None,
                      primitives: dict | None = None) -> str:
    if not kernels:
        return ("## Kernel coverage (op × dtype)\n\nThe plugin publishes no kernels: its kernel "
                "table (`DK_PluginInfo.kernels`) is empty, so there is no op × dtype coverage to show.")
    summary = f"\n\n{primitives_line(primitives, resolution)}." if primitives and resolution else ""
    legend = "; dec: no kernel, runs decomposed into the plugin's kernels" if resolution else ""
    return (f"## Kernel coverage (op × dtype)\n\n{len(kernels)} kernels in the plugin's kernel table. "
            f"✓: native; si/so: accepts strided inputs/outputs{legend}.{summary}\n\n"
            f"{coverage_matrix(kernels, resolution)}")


def _measured_errors_section(results: list[CaseResult]) -> str:
    measured = [r for r in results if r.measured_error is not None]
    if not measured:
        return "## Measured errors\n\nNo case recorded a measured error."
    by_op: dict[tuple, list[CaseResult]] = {}
    others = []
    for r in measured:
        if "op" in r.properties and "dtype" in r.properties:
            by_op.setdefault((r.properties["op"], r.properties["dtype"]), []).append(r)
        else:
            others.append(r)
    sections = ["## Measured errors"]
    if by_op:
        rows = []
        for (op, dtype), cases in sorted(by_op.items()):
            worst = max(cases, key=lambda r: _as_float(r.measured_error))
            failed = sum(1 for r in cases if r.status not in ("passed", "xfail"))
            rows.append([op, dtype, len(cases), failed, worst.measured_error, worst.tolerance or "",
                         f"`{worst.id.split('[', 1)[-1].rstrip(']')}`"])
        sections.append("Worst case per op and dtype (ulp when the tolerance is in ulp, else absolute).\n\n"
                        + _table(["Op", "Dtype", "Cases", "Not passed", "Max error", "Tolerance",
                                  "Worst case"], rows))
    if others:
        sections.append(_table(["Case", "Status", "Measured error", "Tolerance"],
                               [[f"`{r.id}`", r.status, r.measured_error, r.tolerance or ""] for r in others]))
    return "\n\n".join(sections)


def _fallback_section(results: list[CaseResult]) -> str:
    totals: dict[str, list[int]] = {}
    for r in results:
        for key, count in (r.properties.get("fallbacks") or {}).items():
            entry = totals.setdefault(key, [0, 0])
            entry[0] += count
            entry[1] += 1
    if not totals:
        return "## CPU fallbacks\n\nNone: every op ran on the plugin's own kernels."
    rows = [[key, count, cases] for key, (count, cases) in sorted(totals.items(), key=lambda kv: -kv[1][0])]
    return ("## CPU fallbacks\n\nOps that ran on the cpu plugin because the plugin has no kernel for "
            "them (--allow-cpu-fallback).\n\n" + _table(["Op[dtype]", "Calls", "Cases"], rows))


def _as_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("inf")


def _failures_section(results: list[CaseResult]) -> str:
    unsuccessful = sorted((r for r in results if r.status in _UNSUCCESSFUL_ORDER),
                          key=lambda r: _UNSUCCESSFUL_ORDER.index(r.status))
    if not unsuccessful:
        return "## Failures, crashes and timeouts\n\nNone."
    entries = []
    for result in unsuccessful:
        entry = f"### `{result.id}`: {result.status}\n\n{result.message}"
        if result.details.strip():
            details = result.details[-_DETAILS_LIMIT:]
            entry += f"\n\n<details><summary>details</summary>\n\n```\n{details}\n```\n\n</details>"
        entries.append(entry)
    return "## Failures, crashes and timeouts\n\n" + "\n\n".join(entries)


def _expected_failures_section(results: list[CaseResult]) -> str:
    expected = [r for r in results if r.status == "xfail"]
    if not expected:
        return "## Expected failures\n\nNone."
    rows = [[f"`{r.id}`", r.actual_status or "xfail",
             r.expectation.reason if r.expectation else r.message, r.message if r.expectation else ""]
            for r in expected]
    return "## Expected failures\n\n" + _table(["Case", "Outcome", "Reason", "Message"], rows)


# The parts of a skip reason that vary between otherwise identical reasons: quoted names,
# words with digits (float16, n4), upper-case words (STRING), capitalised words inside a
# sentence (an op name); then a list of them is one.
_VARYING = re.compile(r"(?<!\w)'[^']*'|\b[A-Za-z_]*\d[\w.]*|\b[A-Z][A-Z0-9_]{2,}\b|(?<=[a-z:] )[A-Z]\w*")
_VARYING_LIST = re.compile(r"…(?:, …)+")
_SKIP_EXAMPLES = 3


def skip_groups(results: list[CaseResult]) -> list[tuple[str, int, list[str]]]:
    """Skip reasons grouped by their shape (the varying parts as "…"): (shape, cases,
    the first few distinct reasons), most frequent first."""
    groups: dict[str, tuple[list[int], list[str]]] = {}
    for result in results:
        if result.status == "skipped":
            shape = _VARYING_LIST.sub("…", _VARYING.sub("…", result.message))
            count, examples = groups.setdefault(shape, ([0], []))
            count[0] += 1
            if result.message not in examples and len(examples) < _SKIP_EXAMPLES:
                examples.append(result.message)
    return sorted(((shape, count[0], examples) for shape, (count, examples) in groups.items()),
                  key=lambda group: -group[1])


def _skipped_section(results: list[CaseResult]) -> str:
    groups = skip_groups(results)
    if not groups:
        return "## Skipped\n\nNone."
    rows = [[examples[0] if len(examples) == 1 else shape, cases,
             "" if len(examples) == 1 else "; ".join(examples) + (" ..." if len(examples) == _SKIP_EXAMPLES else "")]
            for shape, cases, examples in groups]
    return ("## Skipped\n\nReasons that differ only in names, dtypes or numbers (shown as …) are one row.\n\n"
            + _table(["Reason", "Cases", "For example"], rows))

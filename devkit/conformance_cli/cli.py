"""devkit-conformance PLUGIN [options]: run the conformance suite against a plugin.

Exit status: 0 when no case failed, errored, crashed, timed out or passed
unexpectedly; 1 when one did; 2 when the run could not happen (bad arguments,
an unknown suite, an invalid --expect-fail file, a plugin that does not load,
no case selected).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from .. import ops
from ..ops.spec import dtype_name
from ..plugin import _looks_like_path
from . import reports
from .expectations import ExpectationFileError, apply_expectations, load_expectations, unused
from .results import STATUSES, CaseResult, summarize
from .runner import CaseRunner, CollectionFailure, PluginLoadFailure, collect
from .suites import PROFILE_VARIABLE, PROFILES, available_suites, suite_directory

# The pytest-timeout limit the repository uses too: the collectives matrix case alone
# takes 40-80 s on a loaded 2-core machine.
DEFAULT_CASE_TIMEOUT = 300.0
STATUS_STYLES = {"passed": "green", "failed": "bold red", "error": "bold red", "skipped": "yellow",
                 "crashed": "bold red", "timeout": "bold magenta", "xfail": "cyan", "xpass": "bold yellow"}
# Shown as they happen, above the progress bar.
NOTEWORTHY = ("failed", "error", "crashed", "timeout", "xpass")
# Rich assumes 80 columns when not writing to a terminal; CI logs have room for the whole table.
LOG_WIDTH = 160
RATE_WINDOW = 24 * 3600.0  # seconds of case completions the ETA's rate is taken over: the whole run


class UsageError(Exception):
    """Why the run cannot happen (exit status 2)."""


def build_parser(suites: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devkit-conformance",
        description="Certify a devkit plugin: run the conformance suite against it, each case in a "
                    "worker process that may crash or hang without stopping the run.",
        epilog="Exit status: 0 all cases passed or were skipped/expected to fail; 1 a case failed, "
               "errored, crashed, timed out or passed unexpectedly; 2 the run could not happen. "
               "See docs/conformance.md.")
    parser.add_argument("plugin", metavar="PLUGIN",
                        help="plugin name (found like devkit.load_plugin) or path to a plugin library")
    parser.add_argument("--suite", action="append", metavar="NAME",
                        help=f"run this suite (repeatable; default: all). Available: {', '.join(suites)}")
    parser.add_argument("--profile", choices=list(PROFILES), default="quick",
                        help="quick leaves out the heavy cases (marked 'full'); full runs everything "
                             "(default: %(default)s)")
    parser.add_argument("-k", dest="keyword", metavar="PATTERN",
                        help="select cases by pytest -k expression")
    parser.add_argument("--list", action="store_true", help="list the selected cases and stop")
    parser.add_argument("--allow-cpu-fallback", action="store_true",
                        help="let ops the plugin has no kernel for run on the cpu plugin (counted in the "
                             "reports); the op suite still skips unclaimed kernels")
    parser.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT, metavar="SECONDS",
                        help="kill a case running longer, unless it declares its own limit with "
                             "@pytest.mark.timeout (default: %(default)g)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="worker processes running cases in parallel (default: 1: the cases of "
                             "one plugin may share process-wide plugin state)")
    parser.add_argument("--require-native", metavar="OPS", default="",
                        help="comma-separated ops (Op, or Op[dtype]) that must have native kernels: the run "
                             "fails where one only runs decomposed or not at all")
    parser.add_argument("--expect-fail", type=Path, metavar="FILE",
                        help="known failures: one 'PATTERN: REASON' per line")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the JSON report here")
    parser.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML here")
    parser.add_argument("--report", type=Path, metavar="PATH", help="write the Markdown report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    console = _console(sys.stderr)
    try:
        return _run(argv, console)
    except UsageError as exc:
        console.print(f"devkit-conformance: error: {exc}", markup=False)
        return 2
    except KeyboardInterrupt:
        console.print("devkit-conformance: interrupted", markup=False)
        return 130


def _run(argv: list[str], console: Console) -> int:
    try:
        suite_dir = suite_directory()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    suites = available_suites(suite_dir)
    parser = build_parser(list(suites))
    args = parser.parse_args(argv)
    unknown = [name for name in args.suite or [] if name not in suites]
    if unknown:
        raise UsageError(f"unknown suite {', '.join(map(repr, unknown))}; available suites: "
                         f"{', '.join(suites)}")
    if args.workers < 1 or args.case_timeout <= 0:
        raise UsageError("--workers and --case-timeout must be positive")
    selected = list(dict.fromkeys(args.suite)) if args.suite else list(suites)
    expectations = _read_expectations(args.expect_fail)
    required = _required_native(args.require_native)
    if args.allow_cpu_fallback:
        os.environ["DEVKIT_CPU_FALLBACK"] = "1"  # the workers inherit it
    os.environ[PROFILE_VARIABLE] = args.profile  # the workers inherit it too: a suite may size its cases by it
    plugin = str(Path(args.plugin).resolve()) if _looks_like_path(args.plugin) else args.plugin

    with tempfile.TemporaryDirectory(prefix="devkit-conformance-") as workdir:
        console.print(f"devkit-conformance: loading plugin {args.plugin!r} and collecting the cases of "
                      f"{', '.join(selected)} (profile {args.profile}) in a worker...", markup=False)
        try:
            collection = collect(plugin, suite_dir, [suites[name] for name in selected], args.keyword,
                                 PROFILES[args.profile], Path(workdir), args.case_timeout)
        except PluginLoadFailure as exc:
            raise UsageError(f"plugin {args.plugin!r} does not load: {exc}") from None
        except CollectionFailure as exc:
            raise UsageError(str(exc)) from None
        if args.list:
            _list_cases(collection, console)
            return 0
        if not collection.cases and not collection.errors:
            raise UsageError(f"no cases selected (suites: {', '.join(selected)}, profile {args.profile}"
                             + (f", -k {args.keyword!r})" if args.keyword else ")"))
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        start = time.monotonic()
        results, incidents = _run_cases(plugin, suite_dir, Path(workdir), collection, args,
                                        expectations, console)
        wall_time = time.monotonic() - start

    run = reports.RunRecord(plugin=collection.plugin, command=shlex.join(["devkit-conformance", *argv]),
                            profile=args.profile, suites=selected, started=started,
                            wall_time=wall_time, results=results, incidents=incidents)
    _print_summary(run)
    not_native = _not_native(required, collection.plugin)
    if not_native:
        console.print(f"[bold red]--require-native:[/] not native on {escape(collection.plugin['name'])}: "
                      f"{escape(', '.join(not_native))}")
    for incident in incidents:
        console.print(f"[bold red]incident:[/] {escape(incident)}")
    for expectation in unused(expectations, results):
        console.print(f"warning: --expect-fail line {expectation.line} ({expectation.pattern}) "
                      f"matched no case of this run", markup=False)
    for path, text in ((args.json, reports.json_text), (args.junit, reports.junit_text),
                       (args.report, reports.markdown_text)):
        if path is not None:
            reports.write(path, text(run))
            console.print(f"wrote {path}", markup=False)
    return 0 if run.passed and not not_native else 1


def _required_native(text: str) -> list[tuple[str, str | None]]:
    """--require-native's (op, dtype or None for every dtype of the op)."""
    required = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, _, dtype = item.partition("[")
        dtype = dtype.rstrip("]") or None
        try:
            spec = ops.get(op)
        except ValueError as exc:
            raise UsageError(f"--require-native: {exc}") from None
        if dtype is not None and dtype not in {dtype_name(d) for d in spec.dtypes}:
            raise UsageError(f"--require-native: {op} takes no dtype {dtype!r}")
        required.append((op, dtype))
    return required


def _not_native(required, plugin: dict) -> list[str]:
    """The required (op, dtype) pairs the plugin's kernel table lacks."""
    have = {(k["op"], k["dtype"]) for k in plugin["kernels"]}
    missing = []
    for op, dtype in required:
        wanted = [dtype] if dtype else [dtype_name(d) for d in ops.get(op).dtypes]
        missing += [f"{op}[{d}]" for d in wanted if (op, d) not in have]
    return missing


def _read_expectations(path: Path | None):
    if path is None:
        return []
    try:
        return load_expectations(path)
    except (OSError, ExpectationFileError) as exc:
        raise UsageError(f"--expect-fail: {exc}") from None


def _list_cases(collection, console: Console):
    for case in collection.cases:
        print(case.id)
    for error in collection.errors:
        console.print(f"{error.id}: {error.message}\n{error.details}", markup=False)
    console.print(f"{len(collection.cases)} cases", markup=False)


def _run_cases(plugin, suite_dir, workdir, collection, args, expectations, console):
    # ETA: the remaining cases at the run's average rate so far (the window spans the whole run:
    # case times vary too much for a short one).
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[case]}"))
    with Progress(*columns, console=console, speed_estimate_period=RATE_WINDOW) as progress:
        task = progress.add_task(collection.plugin["name"], total=len(collection.cases) + len(collection.errors),
                                 case="starting a worker: importing the suite and loading the plugin")

        def started(case):
            progress.update(task, case=escape(case.id))

        def progressed(case, event):  # inside a case that runs a batch (the collectives matrix)
            progress.update(task, case=escape(f"{case.id}: {event['done']}/{event['total']} {event['current']}"))

        def finished(result: CaseResult):
            apply_expectations(result, expectations)
            progress.advance(task)
            if result.status in NOTEWORTHY:
                first_line = (result.message.splitlines() or [""])[0]
                progress.console.print(f"[{STATUS_STYLES[result.status]}]{result.status.upper():8}[/] "
                                       f"{escape(result.id)}  {escape(first_line)}")

        for error in collection.errors:
            finished(error)
        runner = CaseRunner(plugin, suite_dir, workdir, args.case_timeout, on_started=started,
                            on_finished=finished, on_progress=progressed)
        results = runner.run(collection.cases, args.workers)
        progress.update(task, case="")
    return collection.errors + results, runner.incidents


def _console(stream) -> Console:
    # soft_wrap: messages and paths are printed whole, never broken across lines.
    return Console(file=stream, highlight=False, soft_wrap=True,
                   width=None if stream.isatty() else LOG_WIDTH)


def _print_summary(run: reports.RunRecord):
    plugin = run.plugin
    table = Table(title=f"{plugin['name']} {plugin['version']} · ABI {plugin['abi_version']} · "
                        f"profile {run.profile}")
    table.add_column("suite")
    table.add_column("cases", justify="right")
    for status in STATUSES:
        table.add_column(status, justify="right", style=STATUS_STYLES[status])
    table.add_column("wall time", justify="right")
    summaries = summarize(run.results)
    for summary in summaries:
        table.add_row(summary.suite, str(summary.total), *(str(summary.counts[s]) for s in STATUSES),
                      f"{summary.wall_time:.1f} s")
    table.add_section()
    table.add_row("total", str(len(run.results)),
                  *(str(sum(summary.counts[s] for summary in summaries)) for s in STATUSES),
                  f"{run.wall_time:.1f} s")
    console = _console(sys.stdout)
    console.print(table)
    groups = reports.skip_groups(run.results)
    if groups:
        console.print("skipped, by reason (… stands for names, dtypes and numbers that vary):", markup=False)
        for shape, cases, examples in groups:
            console.print(f"{cases:>7}  {examples[0] if len(examples) == 1 else shape}", markup=False)
    if plugin.get("primitives") and plugin.get("resolution"):
        console.print(reports.primitives_line(plugin["primitives"], plugin["resolution"]), markup=False)
    console.print("[bold green]PASSED[/]" if run.passed else "[bold red]FAILED[/]")

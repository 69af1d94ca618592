"""Deliberately broken variants of the cpu plugin: the conformance suite's own test.

Each variant is the cpu plugin built with one ``DEVKIT_DEFECT_*`` define,
which plants one realistic defect, and named ``cpu_<defect>`` so that it
loads beside the real plugin. A defect in a device hook (a copy, a free) is
a test-only wrapper of the cpu plugin's hooks (testing/defect_hooks.c,
compiled into those variants alone); the others sit where no hook reaches
-- the support library's stream order, events, graphs, call checks and
tensor layout (devkit/abi/support), the cpu kernels and collectives -- as
``#ifdef`` blocks. A conformance suite is only as good as the
bugs it catches: ``devkit-conformance`` run against each variant must fail,
naming a case that checks what the defect breaks.

    python3 -m devkit.backends.cpu.defects [--out DIR] [--json PATH]

builds every variant, runs its conformance selection and prints the catch
rate (tests/test_defects.py does the same in CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import build as cpu_build

# The test-only wrappers of the cpu plugin's device hooks.
DEFECT_HOOKS = cpu_build.HERE / "testing" / "defect_hooks.c"


@dataclasses.dataclass(frozen=True)
class Defect:
    name: str
    define: str
    description: str
    suite: str            # the conformance suite that must catch it
    keyword: str          # -k selection that keeps the run short
    catches: str          # regex a failing case id must match to count as caught
    kernels: tuple[str, ...] = ()  # the kernel files the selection needs (builds stay quick)
    hook: bool = False    # planted by a wrapper of the device hooks (DEFECT_HOOKS)

    @property
    def plugin_name(self) -> str:
        return "cpu_" + self.name.replace("-", "_")


DEFECTS = (
    Defect("odd-copy", "DEVKIT_DEFECT_ODD_COPY", "a copy drops the last byte at odd sizes",
           "runtime", "copy", r"test_copy", hook=True),
    Defect("ignore-strides", "DEVKIT_DEFECT_IGNORE_STRIDES",
           "kernels claim strided inputs but read every view as compact",
           "ops", "strided and (Add or Relu or Transpose)", r"-strided", ("binary", "unary", "movement")),
    Defect("out-of-order", "DEVKIT_DEFECT_OUT_OF_ORDER", "a stream runs its second item before its first",
           "runtime", "stream", r"test_stream|test_callbacks|test_dependent"),
    Defect("early-event", "DEVKIT_DEFECT_EARLY_EVENT",
           "an event reports completion before the work before it has run",
           "runtime", "event", r"test_event|test_wait_on_event"),
    Defect("f16-accumulate", "DEVKIT_DEFECT_F16_ACCUMULATE",
           "float16 reductions accumulate in float16", "ops", "float16 and (ReduceSum or ReduceMean)",
           r"Reduce(Sum|Mean)-float16", ("reduce",)),
    Defect("size1-broadcast", "DEVKIT_DEFECT_SIZE1_BROADCAST",
           "a present size-1 dimension is not broadcast (only missing leading ones are)",
           "ops", "(Add or Mul) and broadcast", r"broadcast", ("binary",)),
    Defect("leak", "DEVKIT_DEFECT_LEAK", "mem_free does not free the allocation",
           "runtime", "alloc or copy", r"test_", hook=True),
    Defect("trust-attributes", "DEVKIT_DEFECT_TRUST_ATTRIBUTES",
           "kernels trust every attribute and shape they are given (no schema or validator runs)",
           "robustness", "Conv or MaxPool or Concat or Slice or Pad", r"test_kernel_call.*(Conv|MaxPool|Concat|Slice|Pad)/",
           ("linalg", "linalg_packed", "linalg_conv", "linalg_conv_broadcast", "linalg_conv_direct", "linalg_conv_epilogue",
            "linalg_conv_indirect", "linalg_conv_pointwise", "linalg_pool", "movement", "movement_pad", "unary")),
    Defect("graph-ignores-rebind", "DEVKIT_DEFECT_GRAPH_IGNORES_REBIND",
           "graph_rebind succeeds but launches keep using the captured memory",
           "graphs", "rebind", r"test_rebind", ("binary", "unary")),
    Defect("drop-rank", "DEVKIT_DEFECT_DROP_RANK",
           "all_reduce and reduce leave out the last rank's contribution",
           "collectives", "all_reduce_on_a_stream", r"all_reduce"),
)


def get(name: str) -> Defect:
    for defect in DEFECTS:
        if defect.name == name:
            return defect
    raise ValueError(f"no defect named '{name}' (known: {', '.join(d.name for d in DEFECTS)})")


def build_variant(defect: Defect, out_dir: os.PathLike) -> Path:
    """Build the variant (with the kernel files its selection needs); returns its library path."""
    if defect.hook:
        return cpu_build.build(out_dir, defines=[defect.define, "DEVKIT_DEFECT_HOOKS"],
                               name=defect.plugin_name, kernels=list(defect.kernels),
                               extra_sources=[DEFECT_HOOKS])
    return cpu_build.build(out_dir, defines=[defect.define], name=defect.plugin_name,
                           kernels=list(defect.kernels))


@dataclasses.dataclass
class Verdict:
    defect: Defect
    exit_status: int
    failing: list[str]   # ids of failed, errored, crashed or timed-out cases

    @property
    def caught(self) -> bool:
        return self.exit_status == 1 and any(re.search(self.defect.catches, case) for case in self.failing)


# A defect may hang a case (a stream that never reaches a callback); the runner records
# that as a `timeout` failure, and this limit keeps the whole selection short.
CASE_TIMEOUT_S = 60


def run_conformance(defect: Defect, library: Path, work_dir: Path) -> Verdict:
    """Run the variant's conformance selection and read which cases failed."""
    report = work_dir / f"{defect.name}.json"
    command = [sys.executable, "-m", "devkit.conformance_cli", str(library), "--suite", defect.suite,
               "-k", defect.keyword, "--case-timeout", str(CASE_TIMEOUT_S), "--json", str(report)]
    process = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    failing = []
    if report.exists():
        cases = json.loads(report.read_text())["cases"]
        failing = [c["id"] for c in cases if c["status"] in ("failed", "error", "crashed", "timeout")]
    return Verdict(defect, process.returncode, failing)


def main() -> None:
    parser = argparse.ArgumentParser(description="Build every defect variant and report the catch rate.")
    parser.add_argument("--out", type=Path, help="build directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="write the verdicts here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        verdicts = []
        for defect in DEFECTS:
            verdict = run_conformance(defect, build_variant(defect, out), out)
            verdicts.append(verdict)
            mark = "caught" if verdict.caught else "MISSED"
            first = verdict.failing[0] if verdict.failing else "-"
            print(f"{defect.name:16} {mark:7} {len(verdict.failing):4} failing case(s), e.g. {first}")
    caught = sum(v.caught for v in verdicts)
    print(f"catch rate: {caught}/{len(verdicts)}")
    if args.json:
        args.json.write_text(json.dumps([
            {"defect": v.defect.name, "description": v.defect.description, "caught": v.caught,
             "exit_status": v.exit_status, "failing_cases": v.failing} for v in verdicts], indent=2))
    sys.exit(0 if caught == len(verdicts) else 1)


if __name__ == "__main__":
    main()

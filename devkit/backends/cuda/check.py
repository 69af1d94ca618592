"""``python -m devkit.backends.cuda.check``: renders every kernel program of
the cuda plugin as CUDA C and compiles each with ``nvcc --ptx`` for sm_90 and
an older architecture, in parallel processes, so that a syntax or type error
in a kernel fails CI on a machine without a GPU.

Prints "N sources compiled" and exits 0; on an error, the compiler's log of
each failing source and exit status 1. Without nvcc it says so and exits 0
(nothing can be checked); ``--require-nvcc`` makes that an error instead.

``--nvrtc`` (on a GPU machine, with CuPy) compiles them instead the way the
plugin does at run time -- NVRTC through CuPy's bindings for device 0's
architecture, kernels.ModuleCache, with the plugin's options -- which also
fills the plugin's on-disk cache, so that the conformance runs after it
compile nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import dialect, sources
from . import kernels as launcher
from .runtime import unavailable_reason

# sm_75 (Turing): the oldest architecture CUDA 13 still compiles for.
ARCHITECTURES = ("sm_90", "sm_75")


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def compile_ptx(nvcc: str, path: Path, arch: str, defines: list[str], kernels: list[str]) -> str | None:
    """Compiles ``path`` to PTX; the compiler's log on an error, or the names
    of kernels that did not come out as entry points."""
    ptx = path.with_suffix(f".{arch}.ptx")
    command = [nvcc, "--ptx", f"-arch={arch}", *dialect.COMPILE_OPTIONS, *defines, "-o", str(ptx), str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        return f"nvcc exit status {result.returncode}: {' '.join(command)}\n{result.stdout}{result.stderr}"
    entries = set(re.findall(r"^\s*\.(?:visible\s+)?\.entry\s+(\w+)", ptx.read_text(), re.M))
    ptx.unlink()
    missing = [name for name in kernels if name not in entries]
    if missing:
        return f"no entry point for kernel(s) {', '.join(missing)} in the PTX"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.backends.cuda.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", action="append", help=f"architectures (default: {', '.join(ARCHITECTURES)})")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="nvcc processes at once (default: one per core)")
    parser.add_argument("--keep", type=Path, help="write the rendered .cu files to this directory")
    parser.add_argument("-k", "--only", help="only the programs whose name contains this")
    parser.add_argument("--require-nvcc", action="store_true", help="fail when nvcc is absent")
    parser.add_argument("--nvrtc", action="store_true",
                        help="compile through the plugin's own NVRTC path (CuPy, device 0) instead of nvcc")
    args = parser.parse_args(argv)
    if args.nvrtc:
        return _check_nvrtc(args)
    nvcc = find_nvcc()
    if nvcc is None:
        print("cuda kernel check skipped: nvcc not found (on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin)",
              file=sys.stderr)
        return 1 if args.require_nvcc else 0
    architectures = args.arch or list(ARCHITECTURES)
    programs = [p for p in sources.programs() if not args.only or args.only in p.name]
    with tempfile.TemporaryDirectory(prefix="devkit-cuda-check-") as scratch:
        directory = args.keep or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        jobs = []
        for number, program in enumerate(programs):
            path = directory / f"{number:03d}.cu"
            path.write_text(f"// {program.name}\n" + dialect.render(program.source))
            jobs += [(program, path, arch) for arch in architectures]
        failures = []
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each job is an nvcc process
            results = pool.map(lambda job: compile_ptx(nvcc, job[1], job[2], dialect.defines(job[0].options),
                                                       dialect.kernel_names(job[0].source)), jobs)
            for (program, path, arch), error in zip(jobs, results):
                if error is not None:
                    failures.append(f"--- {program.name} ({path.name}) for {arch}: {error}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        print(f"{len(failures)} of {len(jobs)} compilations failed ({len(programs)} sources, "
              f"{', '.join(architectures)})", file=sys.stderr)
        return 1
    print(f"{len(programs)} sources compiled ({len(jobs)} compilations: {', '.join(architectures)}; {nvcc})")
    return 0


def compile_nvrtc(source: str, options: str, kernels: list[str]) -> str | None:
    """Builds ``source`` as the plugin does (one process per job: a CUDA
    context each); the error, or None."""
    try:
        for name in kernels:
            launcher.modules.function(0, source, options, name)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _check_nvrtc(args) -> int:
    reason = unavailable_reason()
    if reason is not None:
        print(f"cuda kernel check (--nvrtc) cannot run: {reason}", file=sys.stderr)
        return 1
    programs = [p for p in sources.programs() if not args.only or args.only in p.name]
    spawn = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs), mp_context=spawn) as pool:
        errors = list(pool.map(compile_nvrtc, [p.source for p in programs], [p.options for p in programs],
                               [dialect.kernel_names(p.source) for p in programs]))
    failures = [f"--- {p.name}: {e}" for p, e in zip(programs, errors) if e is not None]
    if failures:
        print("\n".join(failures), file=sys.stderr)
        print(f"{len(failures)} of {len(programs)} sources failed (NVRTC)", file=sys.stderr)
        return 1
    print(f"{len(programs)} sources compiled (NVRTC, device 0; cached in {launcher.cache_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

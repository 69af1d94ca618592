"""Compiler command for the cpu plugin, shared by setup.py and the tests.

The plugin is its own sources (device hooks, collectives, codegen, kernels)
compiled together with the plugin-support library's (devkit/abi/support)
into one library.

setup.py loads this file by path (the package itself is not importable while
it builds), so it imports nothing from devkit. ``python -m
devkit.backends.cpu.build --out DIR`` builds ``DIR/libdevkit_cpu.so``, which
``devkit.load_plugin("DIR/libdevkit_cpu.so")`` loads beside the installed one
(the name "cpu" always means the built-in; ``--name`` gives a build its own).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ABI_DIR = HERE.parent.parent / "abi"
SUPPORT_DIR = ABI_DIR / "support"
# -O3: GCC vectorises the elementwise loops only with its full cost model.
# -fno-trapping-math: no kernel reads the floating-point exception flags, and
# without it GCC keeps a compare-and-select (a clamp, a special-value blend)
# as a branch, which stops a loop from vectorising; the values computed are
# the same. No -march: the hot loops get AVX2/AVX-512 clones instead
# (DKS_VECTOR_CLONES in dks_kernel.h), so the library runs on any x86-64.
COMPILE_ARGS = ["-std=c11", "-O3", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra",
                "-fno-math-errno", "-fno-trapping-math"]


def sources(kernels: list[str] | None = None) -> list[Path]:
    """The support library's sources, the plugin's own, and the kernel files
    (all, or the named ones)."""
    files = sorted(SUPPORT_DIR.glob("*.c")) + sorted(HERE.glob("*.c"))
    if kernels is None:
        return files + sorted((HERE / "kernels").glob("*.c"))
    return files + [HERE / "kernels" / f"{name}.c" for name in kernels]


def include_dirs() -> list[Path]:
    return [ABI_DIR, SUPPORT_DIR, HERE]


def headers() -> list[Path]:
    return [ABI_DIR / "devkit.h", *SUPPORT_DIR.glob("*.h"), *HERE.glob("*.h"),
            *(HERE / "kernels").glob("*.h")]


def blas() -> tuple[list[str], list[str]]:
    """(compile args, link args) for scipy-openblas32's OpenBLAS.

    The library is found at run time through rpaths: next to an installed
    devkit in the same site-packages (a wheel); in the site-packages of the
    interpreter that builds, where pip installs the runtime dependency (an
    editable install: pip's isolated build environment, where the library is
    at build time, is deleted afterwards); and where it is now (a build tree
    in an environment that already has it)."""
    import scipy_openblas32

    lib_dir = Path(scipy_openblas32.get_lib_dir())
    installed = Path(sysconfig.get_paths()["purelib"]) / "scipy_openblas32" / "lib"
    rpaths = dict.fromkeys(["$ORIGIN/../../../scipy_openblas32/lib", str(installed), str(lib_dir)])
    return ([f"-I{scipy_openblas32.get_include_dir()}"],
            [f"-L{lib_dir}", f"-l{scipy_openblas32.get_library()}", *(f"-Wl,-rpath,{r}" for r in rpaths)])


def build(out_dir: os.PathLike, *, kernels: list[str] | None = None, defines=(),
          name: str = "cpu", extra_sources=()) -> Path:
    """Compile the plugin into ``out_dir/libdevkit_<name>.so``; a name other
    than "cpu" is also the name the plugin reports. ``extra_sources`` are
    compiled in too (the defect variants' hook wrappers)."""
    out = Path(out_dir) / f"libdevkit_{name}.so"
    if name != "cpu":
        defines = [*defines, f'CPU_PLUGIN_NAME="{name}"']
    out.parent.mkdir(parents=True, exist_ok=True)
    blas_compile, blas_link = blas()
    command = [os.environ.get("CC", "cc"), *COMPILE_ARGS, "-fPIC", "-shared",
               *(f"-I{d}" for d in include_dirs()), *blas_compile, *(f"-D{d}" for d in defines),
               *map(str, [*sources(kernels), *extra_sources]), "-o", str(out), *blas_link, "-lm"]
    subprocess.run(command, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for libdevkit_<name>.so")
    parser.add_argument("--kernels", help="comma-separated kernel files (default: all)")
    parser.add_argument("-D", dest="defines", action="append", default=[], help="a C define")
    parser.add_argument("--name", default="cpu")
    args = parser.parse_args()
    kernels = args.kernels.split(",") if args.kernels else None
    print(build(args.out, kernels=kernels, defines=args.defines, name=args.name))


if __name__ == "__main__":
    main()

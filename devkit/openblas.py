"""scipy-openblas32's OpenBLAS (a devkit dependency) for the plugin libraries that link it.

The cpu plugin and its variant builds link it; so may any other plugin. The
loader (devkit.plugin) opens such a library inside ``single_threaded_blas``.
"""

import contextlib
import ctypes
import functools
import mmap
import os
from pathlib import Path

# The soname of scipy-openblas32's library, as a linking library's dynamic
# string table names it.
BLAS_SONAME = b"libscipy_openblas.so"


def links_blas(path) -> bool:
    """Whether the shared library at ``path`` names scipy-openblas32's OpenBLAS
    as a dependency (the cpu plugin and its variant builds do): its soname is
    in the file's dynamic string table. A file that holds the string but
    does not link the library only gets OpenBLAS preloaded."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(BLAS_SONAME) >= 0
    except (OSError, ValueError):  # unreadable or empty: opening it reports the error
        return False


@contextlib.contextmanager
def single_threaded_blas():
    """For a library that links scipy-openblas32's OpenBLAS (links_blas), to
    be opened inside: the OpenBLAS loaded first (preload_blas), and loaded,
    by the import or by the library's rpaths, with no threads of its own.
    The cpu plugin runs OpenBLAS on one thread (kernels/linalg.c), but OpenBLAS
    starts its thread pool when it loads, sized by OPENBLAS_NUM_THREADS
    (default: the cores), and each of its threads busy-waits about 0.1 s
    before it sleeps: on a 2-core machine that took the core the plugin's
    pool needed, and a 2-thread 1x1 Conv in that time ran 1.9x slower (1.0
    against 0.55 ms). The variable is set for the load alone (OpenBLAS reads
    it once, then), so another OpenBLAS is left as it is."""
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        preload_blas()
        yield
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved


@functools.cache
def preload_blas() -> None:
    """Load scipy-openblas32's OpenBLAS, which libdevkit_cpu.so links, from
    wherever the interpreter imports the package (importing it loads the
    library). The library's rpaths cover a wheel and the environment that
    built it; this covers the rest (a venv with --system-site-packages whose
    base has the package, a user site): a loaded library with the same
    soname satisfies the plugin's dependency. Without the package the
    rpaths are all there is, and the plugin's load error names the missing
    library."""
    try:
        import scipy_openblas32
    except ImportError:
        return
    library = Path(scipy_openblas32.get_lib_dir()) / f"lib{scipy_openblas32.get_library()}.so"
    if library.exists():
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)

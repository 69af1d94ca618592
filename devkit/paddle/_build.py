"""Builds the bridge library (bridge.cc, bridge_ccl.cc) against the installed paddle wheel, once.

The library goes to ``<devkit cache>/paddle/<key>/libpaddle-devkit.so``
(devkit's cache root: $DEVKIT_CACHE_DIR, else $XDG_CACHE_HOME/devkit, else
~/.cache/devkit), where the key hashes the sources, the paddle version and the
Python version, so that checkouts and installs with the same inputs share one
build and different inputs never meet. That directory holds nothing else: it
is what CUSTOM_DEVICE_ROOT names, and Paddle loads every library in it.
A build takes about 20 s (g++ is needed); concurrent first uses wait for one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from ..abi import HEADER_PATH
from ..codegen import cache_root

LIBRARY = "libpaddle-devkit.so"
_HERE = Path(__file__).resolve().parent
_SOURCES = (_HERE / "bridge.cc", _HERE / "bridge_ccl.cc")
_HEADERS = (_HERE / "bridge_ccl.h",)
_ABI_DIR = HEADER_PATH.resolve().parent


class BuildError(RuntimeError):
    """The bridge library could not be built (the compiler's output says why)."""


def _paddle_dir() -> Path:
    """The installed paddle package, found without importing it (CUSTOM_DEVICE_ROOT
    must be set before paddle is imported)."""
    try:
        files = metadata.files("paddlepaddle") or []
    except metadata.PackageNotFoundError:
        raise BuildError("paddlepaddle is not installed: pip install 'devkit[paddle]' "
                         "(paddlepaddle==3.3.1)") from None
    for file in files:
        if str(file).replace("\\", "/") == "paddle/__init__.py":
            return Path(file.locate()).resolve().parent
    raise BuildError("paddlepaddle is installed but its paddle/__init__.py is not among its files")


def _key(paddle_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in (*_SOURCES, *_HEADERS, _ABI_DIR / "devkit.h"):
        digest.update(path.read_bytes())
    digest.update(metadata.version("paddlepaddle").encode())
    digest.update(str(paddle_dir).encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def library_dir() -> Path:
    """The directory holding the built bridge library (built now if needed)."""
    paddle_dir = _paddle_dir()
    directory = cache_root() / "paddle" / _key(paddle_dir)
    library = directory / LIBRARY
    if library.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not library.exists():
            _compile(paddle_dir, library)
    return directory


def _compile(paddle_dir: Path, library: Path) -> None:
    include = paddle_dir / "include"
    partial = library.with_name(f".{LIBRARY}.{os.getpid()}")
    command = [
        os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-fPIC", "-shared",
        f"-I{include}", f"-I{include / 'third_party'}", f"-I{_ABI_DIR}",
        f"-I{sysconfig.get_paths()['include']}", *map(str, _SOURCES), "-o", str(partial),
        f"-L{paddle_dir / 'libs'}", "-l:libphi_core.so", f"-Wl,-rpath,{paddle_dir / 'libs'}",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"building the devkit paddle bridge failed:\n{' '.join(command)}\n"
                         f"{result.stderr.strip()}")
    os.replace(partial, library)  # whole, for a concurrent reader

"""The native module (``_tensors.cpp``: tensors, storages, the eager replay), built at first use.

torch.utils.cpp_extension compiles it once (about 10 s of CPU; ninja and a
C++ compiler are needed) into torch's extension cache
(``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), which
later processes load in milliseconds; concurrent first uses wait for one
build. The module's name carries a hash of the source, and the build
compiles a copy of it in its own directory, so that installs and checkouts
with the same source share one build and different sources never meet.
Where it cannot be built or ``DEVKIT_TORCH_NATIVE=0`` is set, tensors are
made and templates replayed in Python (``_memory``, ``_replay``), about 8 us
slower per eager op; ``module()`` is then None and ``reason()`` says why.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import warnings

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tensors.cpp")
_lock = threading.Lock()
_state: dict = {}  # "module": the loaded module or None; "reason": why None


def _build():
    if os.environ.get("DEVKIT_TORCH_NATIVE", "1") == "0":
        return None, "DEVKIT_TORCH_NATIVE=0"
    from torch.utils import cpp_extension
    try:
        with open(_SOURCE, "rb") as file:
            name = f"devkit_torch_tensors_{hashlib.sha256(file.read()).hexdigest()[:16]}"
        directory = cpp_extension._get_build_directory(name, verbose=False)
        source = os.path.join(directory, f"{name}.cpp")
        if not os.path.exists(source):
            shutil.copyfile(_SOURCE, f"{source}.{os.getpid()}")
            os.replace(f"{source}.{os.getpid()}", source)  # whole, for a concurrent build
        module = cpp_extension.load(name, [source], build_directory=directory, extra_cflags=["-O2"],
                                    verbose=False)
    except Exception as exc:  # no compiler or ninja, a failed build: the Python path works
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        warnings.warn(f"devkit.torch makes tensors in Python (about 8 us slower per op): building its native "
                      f"module failed ({reason})", RuntimeWarning, stacklevel=3)
        return None, reason
    return module, None


def module():
    """The native module, or None where tensors are made in Python."""
    try:
        return _state["module"]
    except KeyError:
        with _lock:
            if "module" not in _state:
                _state["module"], _state["reason"] = _build()
        return _state["module"]


def reason() -> str | None:
    """Why tensors are made in Python, or None when the native module is in use."""
    module()
    return _state["reason"]

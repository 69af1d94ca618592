"""How a case reports progress inside itself to devkit-conformance.

A case that runs a long batch (the collectives matrix: every collective,
dtype and size of a rank count in one launch) calls ``report_progress`` as
the batch goes; devkit-conformance shows it beside the case on its progress
bar. Under plain pytest it does nothing.

The worker names its event pipe in DEVKIT_CONFORMANCE_PROGRESS as "PID:FD";
only that process writes to it (the variable is inherited by processes a
case starts, the pipe is not).
"""

from __future__ import annotations

import json
import os

ENVIRONMENT_VARIABLE = "DEVKIT_CONFORMANCE_PROGRESS"


def advertise(fd: int) -> None:
    """In the worker: make ``report_progress`` in this process write events to ``fd``."""
    os.environ[ENVIRONMENT_VARIABLE] = f"{os.getpid()}:{fd}"


def report_progress(done: int, total: int, current: str = "") -> None:
    """``done`` of ``total`` steps of the running case are finished; ``current`` names the last."""
    pid, _, fd = os.environ.get(ENVIRONMENT_VARIABLE, "").partition(":")
    if pid != str(os.getpid()):
        return
    event = {"event": "progress", "done": done, "total": total, "current": current}
    os.write(int(fd), (json.dumps(event) + "\n").encode())

"""ONNX node tests a plugin is known to fail, each with its reason.

Keyed by plugin name ("*": every plugin), then by test name. A listed test
that passes fails the run, so the list only ever shrinks to the truth.
"""

from __future__ import annotations

EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "*": {},
    "cpu": {},
}


def expected_failure(plugin: str, test: str) -> str | None:
    """The written reason ``test`` is expected to fail on ``plugin``, or None."""
    for key in (plugin, "*"):
        if reason := EXPECTED_FAILURES.get(key, {}).get(test):
            return reason
    return None

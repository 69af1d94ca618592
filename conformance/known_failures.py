"""Known failures of the suites that run external oracles, and how a case honours them.

Each list (onnx_node_expectations.py, model_expectations.py) maps a plugin
name ("*": every plugin) to {test name: written reason}. A listed test that
fails is reported as an expected failure with its reason; one that passes
fails the run, so a list only ever shrinks to the truth.

A test that needs a kernel the plugin does not claim is skipped, naming the
op and dtype, as the op suite skips unclaimed pairs: the coverage matrix
says what the plugin claims, and test_ops.py checks the cpu plugin claims
everything. (With --allow-cpu-fallback such a test runs, its fallbacks counted.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from devkit import UnimplementedError


def reason_for(table: dict[str, dict[str, str]], plugin: str, test: str) -> str | None:
    """The written reason ``test`` is expected to fail on ``plugin``, or None."""
    for key in (plugin, "*"):
        if reason := table.get(key, {}).get(test):
            return reason
    return None


def run_expecting(table: dict[str, dict[str, str]], list_file: str, plugin: str, test: str,
                  check: Callable[[], None], order_dependent: dict[str, str] | None = None) -> None:
    """Run ``check``, honouring ``test``'s entry in ``table`` (kept in ``list_file``);
    a test in ``order_dependent`` may fail (an expected failure) or pass."""
    expected = reason_for(table, plugin, test)
    try:
        check()
    except UnimplementedError as exc:
        pytest.skip(reason=f"not claimed by the plugin: {exc}")
    except Exception:
        if expected or (order_dependent and test in order_dependent):
            pytest.xfail(reason=expected or order_dependent[test])
        raise
    if expected:
        pytest.fail(f"{test} is listed as an expected failure ({expected}) but passes: remove it "
                    f"from {list_file}")

"""Known gaps of the built-in plugins in the robustness suite (test_robustness.py).

plugin -> {op: reason}. A kernel case of a listed op that fails is reported as
an expected failure with the reason; its other cases must pass. Issue 17
tracks each gap: an op leaves this list when its validator covers what its
kernels read.
"""

from __future__ import annotations

_NO_VALIDATOR = ("issue 17: no launch-time validator yet beyond the op schema (counts, key dtype, "
                 "attribute presence, types and choices): the kernel trusts shapes and attribute ranges")

KNOWN_GAPS: dict[str, dict[str, str]] = {
}


def reason_for(plugin: str, case_id: str) -> str | None:
    """The written reason kernel case ``case_id`` (OP, or OP/DTYPE/MUTATION) may fail on ``plugin``."""
    return KNOWN_GAPS.get(plugin, {}).get(case_id.split("/", 1)[0])

"""--expect-fail files: known failures, each with the reason it is known.

One expectation per line, ``PATTERN: REASON``; ``#`` starts a comment line;
blank lines are ignored. PATTERN is matched against the whole case id with the
wildcards ``*`` (any run of characters) and ``?`` (one character). Brackets are
literal, because case ids carry their parameters in brackets. The pattern ends
at the first ": " (a case id has "::"; match a ": " inside a parameter with
"??"). A line without a reason is an error.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from .results import FAILURES, CaseResult, Expectation


class ExpectationFileError(ValueError):
    pass


def load_expectations(path: Path) -> list[Expectation]:
    expectations = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, separator, reason = line.partition(": ")
        if not separator or not reason.strip() or not pattern.strip():
            raise ExpectationFileError(
                f"{path}:{number}: expected 'PATTERN: REASON' with a written reason, got {raw!r}")
        expectations.append(Expectation(pattern.strip(), reason.strip(), number))
    return expectations


def matches(expectation: Expectation, case_id: str) -> bool:
    return _compiled(expectation.pattern).fullmatch(case_id) is not None


@functools.cache
def _compiled(pattern: str) -> re.Pattern:
    wildcards = {"*": ".*", "?": "."}
    return re.compile("".join(wildcards.get(char) or re.escape(char) for char in pattern), re.DOTALL)


def apply_expectations(result: CaseResult, expectations: list[Expectation]) -> None:
    """A failure the file expects becomes xfail; a pass it expects to fail becomes xpass."""
    expectation = next((e for e in expectations if matches(e, result.id)), None)
    if expectation is None or result.status not in FAILURES | {"passed"}:
        return
    result.expectation, result.actual_status = expectation, result.status
    if result.status == "passed":
        result.status = "xpass"
        result.message = (f"passed, but expected to fail (--expect-fail line {expectation.line}: "
                          f"{expectation.reason})")
    else:
        result.status = "xfail"


def unused(expectations: list[Expectation], results: list[CaseResult]) -> list[Expectation]:
    """Expectations that matched no case of this run: stale, or a typo."""
    return [e for e in expectations if not any(matches(e, result.id) for result in results)]

"""Cases, their results and the per-suite summary."""

from __future__ import annotations

import dataclasses

from .suites import suite_of

STATUSES = ("passed", "failed", "error", "skipped", "crashed", "timeout", "xfail", "xpass")
# Any of these makes the run fail (exit status 1).
UNSUCCESSFUL = frozenset({"failed", "error", "crashed", "timeout", "xpass"})
# What an --expect-fail line turns into xfail.
FAILURES = frozenset({"failed", "error", "crashed", "timeout"})


@dataclasses.dataclass(frozen=True)
class Case:
    id: str                # pytest node id relative to the suite directory
    timeout: float | None  # the case's own limit (@pytest.mark.timeout), else --case-timeout

    @property
    def suite(self) -> str:
        return suite_of(self.id)


@dataclasses.dataclass(frozen=True)
class Expectation:
    """One line of an --expect-fail file."""

    pattern: str
    reason: str
    line: int


@dataclasses.dataclass
class CaseResult:
    id: str
    status: str
    duration: float = 0.0
    message: str = ""
    details: str = ""
    properties: dict = dataclasses.field(default_factory=dict)
    # Set when an --expect-fail line matched: the status the case had before.
    expectation: Expectation | None = None
    actual_status: str | None = None
    # Seconds since the run began, for the suites' wall time; None for a case that never started.
    started_at: float | None = None

    @property
    def suite(self) -> str:
        return suite_of(self.id)

    @property
    def measured_error(self):
        return self.properties.get("measured_error")

    @property
    def tolerance(self):
        return self.properties.get("tolerance")


@dataclasses.dataclass
class SuiteSummary:
    suite: str
    counts: dict[str, int]
    wall_time: float

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def summarize(results: list[CaseResult]) -> list[SuiteSummary]:
    """Per suite, in the order suites first appear: status counts and wall time."""
    by_suite: dict[str, list[CaseResult]] = {}
    for result in results:
        by_suite.setdefault(result.suite, []).append(result)
    summaries = []
    for suite, suite_results in by_suite.items():
        counts = {status: 0 for status in STATUSES}
        for result in suite_results:
            counts[result.status] += 1
        timed = [r for r in suite_results if r.started_at is not None]
        wall = (max(r.started_at + r.duration for r in timed) - min(r.started_at for r in timed)
                if timed else 0.0)
        summaries.append(SuiteSummary(suite, counts, wall))
    return summaries


def succeeded(results: list[CaseResult]) -> bool:
    return not any(result.status in UNSUCCESSFUL for result in results)

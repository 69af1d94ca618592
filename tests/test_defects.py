"""The conformance suite catches every deliberately broken cpu variant
(devkit/backends/cpu/defects.py): devkit-conformance fails against it, and
a failing case is one that checks what the defect breaks."""

from __future__ import annotations

import pytest

from devkit.backends.cpu import defects


# A variant's selection builds a library and runs its cases crash-isolated: the
# robustness one restarts a worker after every crash it provokes, minutes on a
# loaded 2-core machine, past the suite's default 300 s.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("defect", defects.DEFECTS, ids=[d.name for d in defects.DEFECTS])
def test_conformance_catches_the_defect(defect, tmp_path):
    library = defects.build_variant(defect, tmp_path)
    verdict = defects.run_conformance(defect, library, tmp_path)
    assert verdict.exit_status == 1, f"devkit-conformance exited {verdict.exit_status} against {defect.name}"
    assert verdict.caught, (f"{defect.name} ({defect.description}) was not caught by a case matching "
                            f"{defect.catches!r}; failing cases: {verdict.failing[:10]}")


def test_every_defect_has_its_define_in_the_sources():
    from devkit.backends.cpu import build

    sources = "".join(path.read_text() for path in [*build.sources(), defects.DEFECT_HOOKS])
    for defect in defects.DEFECTS:
        assert f"#ifdef {defect.define}" in sources or f"#ifndef {defect.define}" in sources, defect.name


def test_out_of_order_swaps_each_pair_once_whatever_the_timing(tmp_path):
    """The variant's worker finds the gate callback with work already behind it (as when it
    wakes late on a loaded machine): the gate swaps with the first item once, then runs, and
    the items queued behind it run swapped pairwise. (Swapping the gate again each time would
    float it to the end of the queue and keep every other item in order: the case that then
    passes by chance.)"""
    import threading

    import numpy as np

    import devkit

    dev = devkit.load_plugin(str(defects.build_variant(defects.get("out-of-order"), tmp_path))).device(0)
    order, started, busy, gate = [], threading.Event(), threading.Event(), threading.Event()
    with dev.create_stream() as stream:
        stream.add_callback(lambda: (started.set(), busy.wait(30)))
        assert started.wait(30)  # the worker is inside it: what follows queues up behind
        stream.add_callback(lambda: (gate.wait(30), order.append("gate")))
        for i in range(6):
            stream.add_callback(lambda i=i: order.append(i))
        busy.set()
        while not order:  # the worker swapped the gate with item 0 and ran item 0; now it holds at the gate
            stream.query()
        gate.set()
        stream.synchronize()
    assert order == [0, "gate", 2, 1, 4, 3, 5], np.asarray(order, dtype=object)

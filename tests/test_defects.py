"""The conformance suite catches every deliberately broken cpu variant
(devkit/backends/cpu/defects.py): devkit-conformance fails against it, and
a failing case is one that checks what the defect breaks."""

from __future__ import annotations

import pytest

from devkit.backends.cpu import defects


@pytest.mark.parametrize("defect", defects.DEFECTS, ids=[d.name for d in defects.DEFECTS])
def test_conformance_catches_the_defect(defect, tmp_path):
    library = defects.build_variant(defect, tmp_path)
    verdict = defects.run_conformance(defect, library, tmp_path)
    assert verdict.exit_status == 1, f"devkit-conformance exited {verdict.exit_status} against {defect.name}"
    assert verdict.caught, (f"{defect.name} ({defect.description}) was not caught by a case matching "
                            f"{defect.catches!r}; failing cases: {verdict.failing[:10]}")


def test_every_defect_has_its_define_in_the_sources():
    from devkit.backends.cpu import build

    sources = "".join(path.read_text() for path in build.sources())
    for defect in defects.DEFECTS:
        assert f"#ifdef {defect.define}" in sources or f"#ifndef {defect.define}" in sources, defect.name

"""Generated documentation matches what generates it."""

from pathlib import Path

from devkit.ops import reference_doc

ROOT = Path(__file__).resolve().parent.parent


def test_operator_reference_is_current():
    committed = (ROOT / "docs" / "operators.md").read_text()
    assert committed == reference_doc.render(), (
        "docs/operators.md is stale: run python3 -m devkit.ops.reference_doc > docs/operators.md")

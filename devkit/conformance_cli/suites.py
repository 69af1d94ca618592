"""The conformance suites: one per test_<suite>.py module of devkit.conformance."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SUITE_PACKAGE = "devkit.conformance"
MODULE_PREFIX = "test_"

# --profile -> the pytest marker expression that selects its cases (None: all).
PROFILES = {"quick": "not full", "full": None}
# The profile's name, for the workers: a suite may size its cases by it (the
# robustness suite's full dtypes are not even collected otherwise, plain pytest included).
PROFILE_VARIABLE = "DEVKIT_CONFORMANCE_PROFILE"


def suite_directory() -> Path:
    """Where the suite's modules are, in this install (site-packages or a checkout)."""
    spec = importlib.util.find_spec(SUITE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the conformance suite ({SUITE_PACKAGE}) is not installed; "
                           f"reinstall devkit with 'pip install .'")
    return Path(next(iter(spec.submodule_search_locations)))


def available_suites(directory: Path) -> dict[str, Path]:
    """Suite name -> module file, for every test_<suite>.py in ``directory``."""
    return {suite_name(path.name): path for path in sorted(directory.glob(f"{MODULE_PREFIX}*.py"))}


def suite_name(module_file: str) -> str:
    """test_onnx_node.py -> onnx-node."""
    return Path(module_file).stem[len(MODULE_PREFIX):].replace("_", "-")


def suite_of(case_id: str) -> str:
    """The suite of a case id (a pytest node id relative to the suite directory)."""
    return suite_name(case_id.split("::", 1)[0])

"""PyTorch's OpInfo samples run on devkit and compared with torch on the CPU.

``sweep()`` runs the first samples of every float32 OpInfo in torch's
``op_db`` (its functional form, and its in-place and out= forms on the first
sample) on the registered devkit plugin. A sample whose ops devkit has no
lowering for is *unsupported* (NotImplementedError naming the aten op) and
does not count; every other sample passes or fails against torch CPU with
torch's float32 tolerances.
"""

from __future__ import annotations

import dataclasses
import re
from unittest import mock

import torch
from torch.utils import _pytree

from . import _memory
from ._memory import Unsupported

# Ops whose values are random or unspecified: their results cannot be compared.
_NONDETERMINISTIC = re.compile(r"rand|normal|bernoulli|dropout|uniform|multinomial|empty|poisson|"
                               r"cauchy|exponential|geometric|log_normal|nondeterministic|bucketize_random")
# torch's own refusals of a backend without a kernel or hook (sparse layouts, pinned memory)
_TORCH_REFUSALS = re.compile(r"Could not run 'aten::.*' with arguments from the '\w+' backend|"
                             r"PrivateUse1HooksInterface")


@dataclasses.dataclass
class SampleResult:
    op: str
    variant: str  # "functional", "inplace" or "out"
    index: int
    outcome: str  # "pass", "fail" or "unsupported"
    detail: str = ""


def float32_opinfos():
    from torch.testing._internal.common_methods_invocations import op_db
    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")
            and not _NONDETERMINISTIC.search(op.name)]


def _to_devkit(value):
    return value.to(_memory.DEVICE_TYPE) if isinstance(value, torch.Tensor) else value


def _to_cpu(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


def _compare(got, expected) -> str:
    got = _pytree.tree_map(_to_cpu, got)
    try:
        torch.testing.assert_close(got, expected, equal_nan=True, check_device=False, check_stride=False)
    except AssertionError as exc:
        return str(exc).splitlines()[0] if str(exc) else "mismatch"
    return ""


def _run(fn, sample, make_args):
    args = _pytree.tree_map(make_args, (sample.input, list(sample.args), dict(sample.kwargs)))
    first, rest, kwargs = args
    return fn(first, *rest, **kwargs)


def _one(op, variant, fn, sample, index, prepare=None) -> SampleResult | None:
    clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    try:
        expected = _run(fn, sample, clone) if prepare is None else prepare(fn, sample, clone, "cpu")
    except Exception:
        return None  # torch CPU refuses the sample too (such as an in-place form that would promote)
    try:
        moved = lambda v: _to_devkit(clone(v))  # noqa: E731
        got = _run(fn, sample, moved) if prepare is None else prepare(fn, sample, moved, _memory.DEVICE_TYPE)
    except Unsupported as exc:
        return SampleResult(op.name, variant, index, "unsupported", str(exc).split(" (plugin")[0])
    except NotImplementedError as exc:
        if _TORCH_REFUSALS.search(str(exc)):
            return SampleResult(op.name, variant, index, "unsupported", str(exc).split(".")[0][:120])
        return SampleResult(op.name, variant, index, "fail", f"NotImplementedError: {exc}"[:300])
    except Exception as exc:
        return SampleResult(op.name, variant, index, "fail", f"{type(exc).__name__}: {exc}"[:300])
    problem = _compare(got, expected)
    return SampleResult(op.name, variant, index, "fail" if problem else "pass", problem[:300])


def _with_out(fn, sample, make_args, device):
    reference = _run(fn, sample, lambda v: v.clone() if isinstance(v, torch.Tensor) else v)
    if not isinstance(reference, torch.Tensor):
        raise TypeError("out= is tested for single-tensor results")
    destination = torch.empty(0, dtype=reference.dtype, device=device)
    first, rest, kwargs = _pytree.tree_map(make_args, (sample.input, list(sample.args), dict(sample.kwargs)))
    fn(first, *rest, **kwargs, out=destination)
    return destination


def sweep(max_samples: int = 3, names=None) -> list[SampleResult]:
    """Every float32 OpInfo's first ``max_samples`` samples (of the ops ``names``, if given)."""
    from torch.testing._internal import common_utils

    # OpInfo's sample iterator looks for the running unittest test with inspect.stack() at every
    # sample, which reads source files and dominates the sweep; there is no such test here.
    with mock.patch.object(common_utils, "extract_test_fn", lambda: None):
        return _sweep(max_samples, names)


def _sweep(max_samples, names) -> list[SampleResult]:
    results = []
    for op in float32_opinfos():
        if names is not None and op.name not in names:
            continue
        torch.manual_seed(0)
        try:
            samples = list(_first(op.sample_inputs("cpu", torch.float32), max_samples))
        except Exception:
            continue
        for index, sample in enumerate(samples):
            result = _one(op, "functional", op.op, sample, index)
            if result is not None:
                results.append(result)
        if samples and op.inplace_variant is not None:
            result = _one(op, "inplace", op.inplace_variant, samples[0], 0)
            if result is not None:
                results.append(result)
        if samples and op.supports_out and isinstance(samples[0].input, torch.Tensor):
            result = _one(op, "out", op.op, samples[0], 0, prepare=_with_out)
            if result is not None:
                results.append(result)
    return results


def _first(iterable, count):
    for index, item in enumerate(iterable):
        if index >= count:
            return
        yield item


def summary(results: list[SampleResult]) -> dict:
    """Counts, the pass rate of the supported samples and the ops with a passing sample."""
    counted = [r for r in results if r.outcome != "unsupported"]
    passed = sum(r.outcome == "pass" for r in counted)
    return {
        "samples": len(results), "supported": len(counted), "passed": passed,
        "pass_rate": passed / len(counted) if counted else 0.0,
        "ops_passing": len({r.op for r in counted if r.outcome == "pass"}),
        "failures": [r for r in counted if r.outcome == "fail"],
    }

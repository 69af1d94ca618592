"""Einsum, lowered onto the family's batched product.

Every operand becomes a strided view with one dim per distinct label (the
spec's parse_einsum gives the labels): a repeated label (a diagonal) sums its
strides, a size-1 dim that broadcasts gets stride 0. Operands contract
pairwise, left to right, as the spec states. Labels that neither the output
nor the other operand nor a later one needs are first summed out of the
operand that alone holds them; what remains is a batched GEMM over the batch
labels (in both operands, kept), M (left only), K (in both, summed) and N
(right only). Each group of labels must be one strided dim of the operand
as it lies; an operand where one is not is first gathered into the layout
[batch][M][K] (or [batch][K][N]). The last product lands in the output
directly when its label order is the output's, else it is permuted there;
a single operand is summed or permuted into the output directly.

Intermediate operands and products are held in the compute type (float32
for float16 and bfloat16 operands, which are widened first), so only the
output is rounded to the op's dtype.
"""

from __future__ import annotations

import dataclasses
import math


from ...ops.linalg import parse_einsum
from ..support.boundary import invalid
from .layer import STRIDED, Call
from .linalg_gemm import Matrix, gemm, scratch, sum_view, work_dtype


@dataclasses.dataclass
class _View:
    """A tensor seen through its labels: per distinct label a size and a stride."""

    labels: list
    sizes: list[int]
    strides: list[int]
    buffer: object  # a device buffer
    offset: int
    key: int

    def size(self, label) -> int:
        return self.sizes[self.labels.index(label)]

    def stride(self, label) -> int:
        return self.strides[self.labels.index(label)]

    def merged(self, group: list) -> tuple[int, int] | None:
        """The labels of ``group`` (outermost first) as one dim (size, stride),
        or None when they are not evenly spaced in that order."""
        size, stride = 1, 0
        for label in reversed(group):
            n, s = self.size(label), self.stride(label)
            if n == 1:
                continue
            if size == 1:
                size, stride = n, s
            elif s == stride * size:
                size *= n
            else:
                return None
        return size, stride


def _operand_view(tensor, term: list, sizes: dict) -> _View:
    labels, dims, strides = [], [], []
    for label, n, s in zip(term, tensor.shape, tensor.strides):
        if label in labels:  # a diagonal: both indices step together
            strides[labels.index(label)] += s
            continue
        labels.append(label)
        dims.append(n)
        strides.append(s)
    for j, label in enumerate(labels):
        if dims[j] == 1 and sizes[label] != 1:  # broadcast
            dims[j], strides[j] = sizes[label], 0
    return _View(labels, dims, strides, tensor.buffer, tensor.offset, tensor.dtype)


def _reduce(c: Call, v: _View, labels: list, key: int) -> _View:
    """v summed over the labels not in ``labels``, compact in that order, in dtype key."""
    sizes = [v.size(label) for label in labels]
    strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]
    buffer = scratch(c, key, math.prod(sizes))
    sum_view(c, v.key, v.buffer, v.offset,
             [(n, v.stride(label), s) for label, n, s in zip(labels, sizes, strides)],
             [(n, s) for label, n, s in zip(v.labels, v.sizes, v.strides) if label not in labels],
             key, buffer, 0)
    return _View(list(labels), sizes, strides, buffer, 0, key)


class _Plan:
    """One Einsum call: the operands' views, the output's, and the label order."""

    def __init__(self, c: Call, key: int):
        self.c, self.work = c, work_dtype(key)
        terms, self.output, self.sizes = parse_einsum(c.attrs["equation"], [t.shape for t in c.inputs])
        self.operands = [_operand_view(t, term, self.sizes) for t, term in zip(c.inputs, terms)]
        self.terms = terms
        # Products are laid out in output order; other labels follow by first appearance.
        self.rank = {label: j for j, label in enumerate(self.output)}
        for term in terms:
            for label in term:
                self.rank.setdefault(label, len(self.rank))
        y = c.outputs[0]
        self.y = _View(list(self.output), list(y.shape), list(y.strides), y.buffer, y.offset, y.dtype)

    def _needed(self, v: _View, other: _View, keep: set) -> _View:
        """v without the labels only it holds and nothing later needs, in the work dtype."""
        labels = [label for label in v.labels if label in keep or label in other.labels]
        if len(labels) < len(v.labels) or v.key != self.work:
            return _reduce(self.c, v, labels, self.work)
        return v

    def _operand(self, v: _View, batch: list, outer: list, inner: list) -> tuple[_View, tuple, tuple]:
        """v with the outer and inner groups as single dims (gathered as
        [batch][outer][inner] when they are not), and those dims."""
        outer_dim, inner_dim = v.merged(outer), v.merged(inner)
        if outer_dim is None or inner_dim is None:
            v = _reduce(self.c, v, batch + outer + inner, self.work)
            outer_dim, inner_dim = v.merged(outer), v.merged(inner)
        return v, outer_dim, inner_dim

    def contract(self, a: _View, b: _View, keep: set, last: bool) -> tuple[_View, bool]:
        """a * b summed over their shared labels not in ``keep``; the result's
        labels are the batch, a-only and b-only ones, each in output order.
        Returns the result and whether it was written to the output."""
        a, b = self._needed(a, b, keep), self._needed(b, a, keep)
        order = lambda labels: sorted(labels, key=self.rank.__getitem__)
        batch = order([x for x in a.labels if x in b.labels and x in keep])
        left = order([x for x in a.labels if x not in b.labels])
        right = order([x for x in b.labels if x not in a.labels])
        # K in a's memory order, so that a is likelier to be read as it lies.
        summed = sorted((x for x in a.labels if x in b.labels and x not in keep), key=a.stride,
                        reverse=True)
        labels = batch + left + right
        y = None
        if last and labels == self.output and self.y.key == self.work:
            y = self.y
            if y.merged(left) is None or y.merged(right) is None:
                y = None
        if y is None:
            sizes = [self.sizes[label] for label in labels]
            strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]
            y = _View(labels, sizes, strides, scratch(self.c, self.work, math.prod(sizes)), 0, self.work)
        if math.prod(y.sizes):
            a, (m, a_rs), (k, a_cs) = self._operand(a, batch, left, summed)
            b, (n, b_cs), (_, b_rs) = self._operand(b, batch, right, summed)
            (_, y_rs), (_, y_cs) = y.merged(left), y.merged(right)
            gemm(self.c, self.work, Matrix(a.buffer, a.offset, a_rs, a_cs),
                 Matrix(b.buffer, b.offset, b_rs, b_cs), Matrix(y.buffer, y.offset, y_rs, y_cs), m, n, k,
                 [(self.sizes[x], a.stride(x), b.stride(x), y.stride(x)) for x in batch])
        return y, y is self.y

    def run(self) -> None:
        current, done = self.operands[0], False
        for i in range(1, len(self.operands)):
            keep = set(self.output).union(*self.terms[i + 1:])
            current, done = self.contract(current, self.operands[i], keep, i + 1 == len(self.operands))
        if not done:
            y = self.y
            sum_view(self.c, current.key, current.buffer, current.offset,
                     [(n, current.stride(label), s) for label, n, s in zip(y.labels, y.sizes, y.strides)],
                     [(n, s) for label, n, s in zip(current.labels, current.sizes, current.strides)
                      if label not in y.labels],
                     y.key, y.buffer, y.offset)


def _einsum(c: Call, key: int) -> None:
    if len(c.outputs) != 1:
        raise invalid(f"Einsum has 1 output, got {len(c.outputs)}")
    if c.outputs[0].size:
        _Plan(c, key).run()


def register(table, unclaimed) -> None:
    table.claim("Einsum", _einsum, STRIDED, unclaimed)

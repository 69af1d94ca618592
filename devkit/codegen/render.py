"""A fused group written out as one kernel in a dialect.

A Group is elementwise and broadcast ops over one domain shape, and
optionally reductions over the domain's last axis (kept as a size-1 axis).
Without reductions a work item is one element of the domain; with them a
work item is one row: each reduction is a loop over the row that computes
its input inline, values that depend only on the row (the reductions and
what follows from them) are scalars of the row, and a last loop writes the
outputs. Every op's expression comes from its rule (rules.py); the printer
(printers.py) supplies the dialect.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from .printers import Printer
from .rules import REDUCTIONS, RULES


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """An input or output tensor of the group: shape, element strides, dtype."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class GroupOp:
    """One op: its operands are ("in", k) for input k or ("op", m) for op m."""

    op: str
    args: tuple[tuple[str, int], ...]
    attrs: dict
    in_dtypes: tuple[np.dtype, ...]
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclasses.dataclass
class Group:
    domain: tuple[int, ...]
    inputs: list[TensorArg]
    ops: list[GroupOp]
    outputs: list[tuple[int, TensorArg]]  # (op index, the tensor it is written to)

    @property
    def rows(self) -> bool:
        return any(op.op in REDUCTIONS for op in self.ops)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A rendered group: the source, the function's name, how many tensor
    arguments it takes (inputs then outputs), and its launch range."""

    source: str
    name: str
    num_tensors: int
    items: int
    grain: int  # the smallest chunk worth a thread ("c")


def _aligned(shape: tuple, strides: tuple, domain: tuple) -> tuple[tuple, tuple]:
    """``shape``/``strides`` right-aligned to ``domain``, broadcast axes at stride 0."""
    pad = len(domain) - len(shape)
    dims = (1,) * pad + tuple(shape)
    steps = (0,) * pad + tuple(s if d > 1 else 0 for s, d in zip(strides, shape))
    return dims, steps


def _offset(var: str, dims: tuple, strides: tuple, unit: int = 1) -> str:
    """The element offset of the index ``var`` over row-major ``dims`` (the
    domain's), for a tensor of ``strides`` (0 along its broadcast axes); a
    step of ``var`` is ``unit`` elements of a compact tensor (a row kernel's
    row index: the row's length)."""
    compact = unit
    is_compact = True
    for d in reversed(range(len(dims))):
        if dims[d] > 1 and strides[d] != compact:
            is_compact = False
        compact *= dims[d]
    if is_compact and any(s for s in strides):
        return var if unit == 1 else f"{var} * {unit}"
    first = next((d for d in range(len(dims)) if dims[d] > 1), len(dims))
    terms, suffix = [], 1
    for d in reversed(range(len(dims))):
        if dims[d] > 1 and strides[d]:
            coord = var if suffix == 1 else f"({var} / {suffix})"
            if d != first:
                coord = f"({coord} % {dims[d]})"
            terms.append(coord if strides[d] == 1 else f"{coord} * {strides[d]}")
        suffix *= dims[d]
    return " + ".join(reversed(terms)) or "0"


def render(group: Group, p: Printer) -> Kernel:
    """The group as one kernel in ``p``'s dialect (see the module doc)."""
    body = _Body(group, p)
    params = [(f"in{k}", p.storage(t.dtype), False) for k, t in enumerate(group.inputs)]
    params += [(f"out{k}", p.storage(t.dtype), True) for k, (_, t) in enumerate(group.outputs)]
    lines = body.row_kernel() if group.rows else body.elementwise_kernel()
    text = "\n".join(lines)
    name = "dk_fused_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    first, binds = p.signature(name, params)
    source = "\n".join([p.prologue, first + " {", *("  " + b for b in binds), text, "}", ""])
    domain = group.domain
    if group.rows:
        items, per_item = int(np.prod(domain[:-1])), domain[-1]
    else:
        items, per_item = int(np.prod(domain)), 1
    return Kernel(source, name, len(params), items, max(1, 16384 // max(per_item, 1)))


class _Body:
    def __init__(self, group: Group, p: Printer):
        self.g, self.p = group, p
        domain = group.domain
        rows = group.rows
        self.outer = domain[:-1] if rows else domain
        self.n = domain[-1] if rows else 1
        # per input: aligned dims and strides over the domain
        self.aligned = [_aligned(t.shape, t.strides, domain) for t in group.inputs]
        # An elementwise kernel loops over rows and columns where the dialect
        # can and an input's offset needs more than the flat index.
        self.split = (not rows and len(domain) >= 2 and domain[-1] > 1
                      and p.row_chunk_loop("r", "j", domain[-1]) is not None
                      and any(_offset("i", domain, strides) not in ("i", "0") for _, strides in self.aligned))
        self.full = {}  # ("in"|"op", k) -> whether it varies along the row (row kernels, split kernels)
        for k, (dims, _) in enumerate(self.aligned):
            self.full[("in", k)] = (rows or self.split) and dims[-1] > 1
        for m, op in enumerate(group.ops):
            self.full[("op", m)] = op.op not in REDUCTIONS and any(self.full[a] for a in op.args)
        # Divisions of a row's values by a row scalar multiply by its
        # reciprocal, computed once per row: a multiply is several times
        # cheaper than a divide, and no compiler hoists it without
        # -freciprocal-math (the result moves by an ulp at most).
        self.reciprocals = {m: op.args[1] for m, op in enumerate(group.ops)
                            if rows and op.op == "Div" and np.dtype(op.dtype).kind == "f" and self.full[op.args[0]]
                            and not self.full[op.args[1]]}

    def _name(self, ref) -> str:
        kind, k = ref
        return f"x{k}" if kind == "in" else f"v{k}"

    def _dtype(self, ref):
        kind, k = ref
        return self.g.inputs[k].dtype if kind == "in" else self.g.ops[k].dtype

    def _expression(self, m: int) -> str:
        op = self.g.ops[m]
        if m in self.reciprocals:
            return f"(({self._name(op.args[0])}) * r{m})"
        return RULES[op.op](self.p, [self._name(a) for a in op.args], op.attrs, op.in_dtypes, op.dtype)

    def _reciprocal_lines(self, divisor) -> list[str]:
        """The row scalars 1 / ``divisor`` of the divisions in self.reciprocals."""
        p = self.p
        return [f"{p.compute(self.g.ops[m].dtype)} r{m} = {p.literal(1, self.g.ops[m].dtype)} / ({self._name(d)});"
                for m, d in self.reciprocals.items() if d == divisor]

    def _define(self, ref, index: str, row: str | None) -> str:
        """The line that defines value ``ref`` (an input load or an op)."""
        p = self.p
        kind, k = ref
        dtype = self._dtype(ref)
        if kind == "in":
            dims, strides = self.aligned[k]
            domain = self.g.domain
            if row is None:
                offset = _offset(index, domain, strides)
            else:
                base = _offset(row, domain[:-1], strides[:-1], domain[-1])
                offset = base if not self.full[ref] else (
                    f"{base} + {index}" if strides[-1] == 1 else f"{base} + {index} * {strides[-1]}")
            return f"{p.compute(dtype)} x{k} = {p.load(f'in{k}', offset, dtype)};"
        return f"{p.compute(dtype)} v{k} = {self._expression(k)};"

    def _needed(self, targets, full_only: bool) -> list:
        """The values ``targets`` depend on, in order; with ``full_only`` only
        those that vary along the row (the rest are row scalars already)."""
        seen, order = set(), []

        def visit(ref):
            if ref in seen or (full_only and not self.full[ref]):
                return
            seen.add(ref)
            if ref[0] == "op":
                for a in self.g.ops[ref[1]].args:
                    visit(a)
            order.append(ref)

        for t in targets:
            visit(t)
        return order

    def _stores(self, index: str, row: str | None, full: bool) -> list[str]:
        p = self.p
        lines = []
        for k, (m, tensor) in enumerate(self.g.outputs):
            if self.full[("op", m)] != full and row is not None:
                continue
            if row is None:
                offset = index
            else:
                offset = f"{row} * {self.n} + {index}" if full else row
            lines.append(p.store(f"out{k}", offset, f"v{m}", tensor.dtype))
        return lines

    def elementwise_kernel(self) -> list[str]:
        """The loops over the call's items; where the printer has checked
        math calls and the group makes one, those loops over each block, and
        the plain ones again over a block in which a checked call flagged
        an argument (Printer.checked)."""
        accurate = self._elementwise_loops()
        checked = self.p.checked()
        if checked is None:
            return accurate
        fast = _Body(self.g, checked)._elementwise_loops()
        if not checked.used:
            return accurate
        return self.p.checked_blocks(fast, accurate)

    def _elementwise_loops(self) -> list[str]:
        refs = self._needed([("op", m) for m, _ in self.g.outputs], full_only=False)
        if self.split:
            width = self.g.domain[-1]
            opened, closed = self.p.row_chunk_loop("r", "j", width)
            return [*("  " + line for line in opened), *("      " + self._define(r, "j", "r") for r in refs),
                    *("      " + self.p.store(f"out{k}", f"r * {width} + j", f"v{m}", tensor.dtype)
                      for k, (m, tensor) in enumerate(self.g.outputs)),
                    *("  " + line for line in closed)]
        opened, closed = self.p.item_loop("i")
        return ["  " + opened[0], *("    " + self._define(r, "i", None) for r in refs),
                *("    " + s for s in self._stores("i", None, True)), "  " + closed[0]]

    def row_kernel(self) -> list[str]:
        p = self.p
        opened, closed = p.item_loop("r")
        lines = ["  " + opened[0]]
        defined: set = set()

        def define_row_values(upto: int):
            """The row scalars computable before op ``upto`` (inputs and ops that do not vary along the row)."""
            refs = self._needed([("op", m) for m in range(upto)] + [("in", k) for k in range(len(self.g.inputs))],
                                full_only=False)
            for ref in refs:
                if ref in defined or self.full[ref] or (ref[0] == "op" and self.g.ops[ref[1]].op in REDUCTIONS
                                                         and ref not in defined_reductions):
                    continue
                if ref[0] == "op" and any(a not in defined for a in self.g.ops[ref[1]].args):
                    continue
                defined.add(ref)
                lines.append("    " + self._define(ref, "j", "r"))
                lines.extend("    " + line for line in self._reciprocal_lines(ref))

        defined_reductions: set = set()
        for m, op in enumerate(self.g.ops):
            if op.op not in REDUCTIONS:
                continue
            define_row_values(m)
            init, combine, finish = REDUCTIONS[op.op]
            ctype = p.compute(op.dtype)
            source = op.args[0]
            body = [self._define(ref, "j", "r") for ref in self._needed([source], full_only=True)]
            lines += ["    " + line for line in p.reduction_loop(f"acc{m}", ctype, init(p, op.dtype), self.n, body,
                                                                 self._name(source),
                                                                 lambda a, b: combine(p, a, b))]
            lines.append(f"    {ctype} v{m} = {finish(p, f'acc{m}', self.n, op.dtype)};")
            lines.extend("    " + line for line in self._reciprocal_lines(("op", m)))
            defined.add(("op", m))
            defined_reductions.add(("op", m))
        define_row_values(len(self.g.ops))
        lines += ["    " + s for s in self._stores("j", "r", full=False)]
        full_outputs = [("op", m) for m, _ in self.g.outputs if self.full[("op", m)]]
        if full_outputs:
            lines.append(f"    for (long j = 0; j < {self.n}; j++) {{")
            for ref in self._needed(full_outputs, full_only=True):
                lines.append("      " + self._define(ref, "j", "r"))
            lines += ["      " + s for s in self._stores("j", "r", full=True)]
            lines.append("    }")
        lines.append("  " + closed[0])
        return lines

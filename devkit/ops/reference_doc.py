"""docs/operators.md, written from the op specs themselves.

    python3 -m devkit.ops.reference_doc > docs/operators.md

tests/test_docs.py fails when the committed file differs from this output.
"""

from __future__ import annotations

from ..backends.cpu import FLOAT32_ULP_BOUNDS
from . import FAMILIES, all_specs, output_keyword
from .primitives import PRIMITIVES, PRIMITIVES_VERSION, REASONS
from .spec import REQUIRED, OpSpec, dtype_name

FAMILY_TITLES = {
    "unary": "Unary elementwise", "binary": "Binary and variadic elementwise",
    "reduce": "Reductions, scans and softmax", "linalg": "Linear algebra, convolution and pooling",
    "nn": "Normalization, attention and other NN ops", "movement": "Data movement",
    "shape": "Shape, cast and creation", "training": "Training: gradients, losses and optimizers",
}


def _inputs(spec: OpSpec) -> str:
    parts = []
    for i in spec.inputs:
        label = f"`{i.name}`" + ("…" if i.variadic else "")
        notes = [n for n, on in (("optional", i.optional), ("host", i.host), ("read by infer", i.read_by_infer)) if on]
        parts.append(label + (f" ({', '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def _outputs(spec: OpSpec) -> str:
    """The outputs; the optional trailing ones marked with the keyword that
    asks devkit.ops.X for them, and those a kernel call may leave out."""
    first_optional = len(spec.outputs) - spec.optional_outputs
    first_skippable = len(spec.outputs) - spec.skippable_outputs
    parts = []
    for k, o in enumerate(spec.outputs):
        notes = []
        if k >= first_optional:
            notes.append(f"optional: `{output_keyword(o)}=True`")
        if k >= first_skippable:
            notes.append("a kernel call may leave it out")
        parts.append(f"`{o}`" + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def _attrs(spec: OpSpec) -> str:
    if not spec.attrs:
        return "—"
    parts = []
    for a in spec.attrs:
        default = "required" if a.default is REQUIRED else "no default" if a.default is None else repr(a.default)
        parts.append(f"`{a.name}`: {a.kind} ({default})")
    return "<br>".join(parts)


def _tolerances(spec: OpSpec) -> str:
    groups: dict[str, list[str]] = {}
    for dtype in spec.dtypes:
        groups.setdefault(str(spec.tolerance_for(dtype)), []).append(dtype_name(dtype))
    text = "<br>".join(f"{tol}: {', '.join(names)}" for tol, names in groups.items())
    if spec.name in FLOAT32_ULP_BOUNDS:
        text += f"<br>(cpu plugin, float32: a polynomial, at most {FLOAT32_ULP_BOUNDS[spec.name]} ulp measured)"
    return text


def _key(spec: OpSpec) -> str:
    if isinstance(spec.key, str):
        return f"attribute `{spec.key}`"
    return f"`{spec.inputs[spec.key].name}`"


def render() -> str:
    specs = all_specs()
    pairs = sum(len(s.dtypes) for s in specs)
    lines = [
        "# Operator set v1",
        "",
        "<!-- Written by `python3 -m devkit.ops.reference_doc`; do not edit by hand. -->",
        "",
        f"{len(specs)} ops, {pairs} (op, dtype) pairs. Names and semantics are ONNX's, at the opset "
        "given. A kernel is keyed by the dtype of the key input (or attribute). *host* inputs are "
        "read on the host and reach kernels as attributes of the same name; an input *read by "
        "infer* is copied to the host for shape inference and still passed as a tensor.",
        "",
        "Tolerances are against the float64 NumPy reference rounded to the output dtype: *exact* "
        "means correctly rounded (bit-exact for data movement and integers); *n ulp* counts units "
        "in the last place of the output dtype; *rtol/atol* bound |got − ref| by atol + rtol·|ref|. "
        "float16 and bfloat16 are storage types computed in float32.",
        "",
        "*Optional* outputs are the trailing ones ONNX's schema marks optional. `devkit.ops.X(...)` returns "
        "only the required outputs (one Array, or a tuple for several) unless asked for others: "
        "`return_<output>=True`, the output's name in snake_case (`ops.MaxPool(x, kernel_shape=[2, 2], "
        "return_indices=True)` returns `(Y, Indices)`), or `outputs=n`, the first n. `devkit.run_op(..., "
        "outputs=n)`, the ONNX runner and plans likewise return an optional output only to a caller that "
        "names it. One that *a kernel call may leave out* is then not computed either: the kernel gets the "
        "shorter call (`num_outputs` smaller) and must skip it; the others are still allocated and passed to "
        "the kernel, and dropped.",
    ]
    for family in FAMILIES:
        members = [s for s in specs if s.category == family]
        if not members:
            continue
        lines += ["", f"## {FAMILY_TITLES[family]}", "",
                  "| Op | Opset | Inputs | Outputs | Attributes | Key | Tolerance by dtype |",
                  "|---|---|---|---|---|---|---|"]
        for s in members:
            cells = [f"**{s.name}**", str(s.opset), _inputs(s), _outputs(s),
                     _attrs(s), _key(s), _tolerances(s)]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines += [""] + [f"- **{s.name}**: {' '.join(s.doc.split())}" for s in members]
    return "\n".join(lines + _primitives_section(specs)) + "\n"


def _uses(spec: OpSpec) -> str:
    """The ops a decomposition calls, at the dtypes of the first non-widened dtype."""
    rule = spec.decompose
    direct = next((d for d in spec.dtypes if rule.wider(d) is None), None)
    if direct is None:
        return "—"
    names = sorted({op if used == direct else f"{op}[{dtype_name(used)}]"
                    for op, used in rule.uses_for(spec.name, direct)})
    return ", ".join(names) or "(no op: the result is metadata)"


def _widened(spec: OpSpec) -> str:
    rule = spec.decompose
    parts = [f"{dtype_name(d)} at {dtype_name(rule.wider(d))}" for d in spec.dtypes if rule.wider(d) is not None]
    return ", ".join(parts) or "—"


def _primitives_section(specs) -> list[str]:
    lines = ["", f"## The primitive set (v{PRIMITIVES_VERSION})", "",
             f"{len(PRIMITIVES)} ops (`devkit.ops.PRIMITIVES`): a plugin with kernels for these, at every dtype "
             "they take, runs every op above on its own device; the others decompose into them "
             "(docs/primitives.md).", "",
             "| Primitive | Why it is one (what decomposes through it) |", "|---|---|"]
    lines += [f"| **{name}** | {REASONS[name]} |" for name in sorted(PRIMITIVES)]
    lines += ["", "## Decompositions", "",
              "Each op that is not a primitive runs, where a plugin has no kernel for it, as the ops "
              "below (at the op's key dtype unless a dtype is named; those may decompose in turn). "
              "*Runs at*: dtypes that run as the op at a wider float dtype between Casts, as the "
              "kernels compute. A decomposition tolerance replaces the op's where the rule rounds "
              "differently.", "",
              "| Op | Uses | Runs at | Decomposition tolerance |", "|---|---|---|---|"]
    for s in specs:
        if s.decompose is None:
            continue
        tolerance = "the op's"
        if s.decompose.tolerance is not None:
            groups: dict[str, list[str]] = {}
            for dtype in s.dtypes:
                groups.setdefault(str(s.tolerance_for(dtype, decomposed=True)), []).append(dtype_name(dtype))
            tolerance = "<br>".join(f"{tol}: {', '.join(names)}" for tol, names in groups.items())
            tolerance += f"<br>({s.decompose.reason})"
        cells = [f"**{s.name}**", _uses(s), _widened(s), tolerance]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


if __name__ == "__main__":
    print(render(), end="")

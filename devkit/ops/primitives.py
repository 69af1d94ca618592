"""The primitive set: the ops a plugin implements so that every op of the op
set runs on its device (the others decompose into these; docs/primitives.md).

Versioned with the op set: a new op set version may change the list, never a
release of one version.
"""

from __future__ import annotations

PRIMITIVES_VERSION = 1  # the op set version (docs/operators.md, "Operator set v1")

PRIMITIVES = frozenset({
    # elementwise math: the functions with no short, accurate identity in the others
    "Exp", "Log", "Sqrt", "Sin", "Cos", "Atan", "Erf", "Floor",
    # elementwise arithmetic (Sub, Neg, Abs, Max, ... follow) and the float remainder
    "Add", "Mul", "Div", "Pow", "Mod",
    # comparison, selection, conversion, bits
    "Equal", "Less", "Where", "Cast", "BitwiseAnd",
    # data movement
    "Reshape", "Transpose", "Expand", "Slice", "Concat", "Gather", "ScatterElements",
    # reductions, scan and contraction
    "ReduceSum", "ReduceMax", "CumSum", "MatMul",
})

# The reasons for the list, rendered into docs/primitives.md.
REASONS = {
    "Exp": "exponentials, sigmoids, softmax, Softplus, Elu, hyperbolic functions",
    "Log": "LogSoftmax, Softplus, ReduceLogSumExp, the inverse hyperbolic functions",
    "Sqrt": "norms (ReduceL2, the normalizations), Asin/Acos",
    "Sin": "Tan (with Cos), rotary embeddings' caches stay inputs",
    "Cos": "Tan (with Sin); cos(x) = sin(x + pi/2) loses accuracy for large x",
    "Atan": "Asin, Acos; no short accurate identity from Exp/Log",
    "Erf": "Gelu and GeluGrad; a polynomial would be its own kernel",
    "Floor": "Ceil, Round, integer-valued index arithmetic of Resize",
    "Add": "Sub (with Mul by -1, wrapping for integers), Sum, Mean, every affine step",
    "Mul": "Neg, scaling, the normalizations, masks",
    "Div": "Reciprocal, means, normalizations; integer division truncates as C does",
    "Pow": "Pow with negative bases and integer exponents has no Exp/Log identity",
    "Mod": "float fmod is exact in hardware and inexact as x - trunc(x/y)*y",
    "Equal": "IsNaN (x != x), And/Or/Not/Xor on bool through Where, argmax ties",
    "Less": "Greater (swapped), LessOrEqual/GreaterOrEqual (with Equal), Max, Min, Relu, Clip, Sign",
    "Where": "every select: Relu, Clip, masks, the logical ops",
    "Cast": "float16/bfloat16 ops run in float32 between Casts; index dtypes",
    "BitwiseAnd": "BitwiseOr, BitwiseXor and BitwiseNot through wrapping Add/Mul",
    "Reshape": "Flatten, Squeeze, Unsqueeze, Identity, DepthToSpace/SpaceToDepth",
    "Transpose": "DepthToSpace/SpaceToDepth, Einsum, moving a reduced axis last",
    "Expand": "Tile, ConstantOfShape, broadcasting constants",
    "Slice": "Split, Pad (with Concat), pools' windows, TopK's first K",
    "Concat": "Pad, Tile, Split's inverse in gradients",
    "Gather": "GatherElements and GatherND on flattened data, Resize, pools' im2col",
    "ScatterElements": "ScatterND, OneHot, TopK's sort, NonZero, gradients of gathers",
    "ReduceSum": "ReduceMean/L1/L2/SumSquare, softmax denominators, the normalizations",
    "ReduceMax": "ReduceMin (through negation or bitwise not), ArgMax/ArgMin, MaxPool, softmax stability",
    "CumSum": "index ramps on the device (Range, EyeLike, Trilu), NonZero's positions",
    "MatMul": "Gemm, Conv (im2col), ConvTranspose, Einsum, Attention",
}

"""A model zoo built in code: small ONNX models of common architectures with
seeded random float32 weights, for regressions against other runtimes.

Every builder returns ``(model, inputs)``: an ``onnx.ModelProto`` and a dict
of example inputs by graph-input name. The same seed gives the same weights
and inputs. The sizes keep each model to a fraction of a second on the cpu
plugin and in ``onnx.reference``:

- ``mlp``: Gemm / MatMul layers with Relu and a Softmax head (opset 18);
- ``resnet``: a ResNet-style CNN: Conv + BatchNormalization + Relu, residual
  Adds (one through a strided 1x1 projection), MaxPool, GlobalAveragePool,
  Flatten and a Gemm classifier (opset 19);
- ``transformer_encoder``: a pre-norm encoder block: LayerNormalization,
  MatMul projections, explicit Softmax attention whose head reshapes are
  computed from the input's Shape, Gelu feed-forward, residuals (opset 20);
- ``llama_decoder``: a Llama-style decoder block: RMSNormalization,
  RotaryEmbedding at given position ids, causal grouped-query Attention, a
  SwiGLU feed-forward (SiLU as x * Sigmoid(x)), residuals (opset 23);
- ``unet``: a two-level U-Net: Conv, MaxPool, ConvTranspose and Resize
  upsampling, Concat skip connections (opset 19).

LARGE_MODELS are full-size ones for benchmarks (``devkit-bench engine``),
too slow for ``onnx.reference``:

- ``resnet18``: ResNet-18 at 224x224 (opset 19);
- ``gpt``: a 4-layer GPT-style decoder stack, 128 tokens x 256, causal
  attention by an additive mask, Gelu MLPs (opset 20).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    """Accumulates nodes and seeded float32 initializers under unique names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.initializers: list = []
        self._count = 0

    def _name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, stem: str, array) -> str:
        name = self._name(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, stem: str, shape, fan_in: int | None = None) -> str:
        """Normal weights scaled by 1 / sqrt(fan_in) (default: the first dim)."""
        scale = 1.0 / math.sqrt(fan_in if fan_in is not None else shape[0])
        return self.const(stem, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        """Adds a node of one output; returns the output's name."""
        name = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def model(self, name: str, inputs: list, output: str, shape: list, opset: int):
        """The model; ``output`` (of ``shape``) becomes its single output, "output"."""
        for node in self.nodes:
            node.output[:] = ["output" if value == output else value for value in node.output]
        graph = helper.make_graph(self.nodes, name, inputs,
                                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
                                  self.initializers)
        opsets = [helper.make_opsetid("", opset)]
        # The oldest IR version the opset allows, not the installed onnx's
        # newest: an older onnxruntime refuses IR versions it does not know.
        return helper.make_model(graph, opset_imports=opsets, producer_name="devkit.onnx.zoo",
                                 ir_version=helper.find_min_ir_version_for(opsets))

    # -- layers -----------------------------------------------------------------------

    def linear(self, x: str, n_in: int, n_out: int, bias: bool = True) -> str:
        y = self.op("MatMul", [x, self.weight("w", (n_in, n_out))])
        return self.op("Add", [y, self.const("b", self.small(n_out))]) if bias else y

    def conv(self, x: str, c_in: int, c_out: int, kernel: int, stride: int = 1, bias: bool = True) -> str:
        pad = kernel // 2
        inputs = [x, self.weight("conv_w", (c_out, c_in, kernel, kernel), fan_in=c_in * kernel * kernel)]
        if bias:
            inputs.append(self.const("conv_b", self.small(c_out)))
        return self.op("Conv", inputs, kernel_shape=[kernel, kernel], strides=[stride, stride],
                       pads=[pad] * 4)

    def batch_norm(self, x: str, channels: int) -> str:
        scale = self.rng.uniform(0.5, 1.5, channels).astype(np.float32)
        mean = self.small(channels)
        var = self.rng.uniform(0.5, 1.5, channels).astype(np.float32)
        bias = self.small(channels)
        return self.op("BatchNormalization", [x, self.const("bn_scale", scale), self.const("bn_b", bias),
                                              self.const("bn_mean", mean), self.const("bn_var", var)])

    def conv_bn(self, x: str, c_in: int, c_out: int, kernel: int, stride: int = 1) -> str:
        return self.batch_norm(self.conv(x, c_in, c_out, kernel, stride, bias=False), c_out)

    def basic_block(self, x: str, c_in: int, c_out: int, stride: int) -> str:
        """ResNet's basic block: two 3x3 conv_bn, the shortcut a strided 1x1 conv_bn where shapes change."""
        h = self.op("Relu", [self.conv_bn(x, c_in, c_out, 3, stride)])
        h = self.conv_bn(h, c_out, c_out, 3)
        shortcut = x if stride == 1 and c_in == c_out else self.conv_bn(x, c_in, c_out, 1, stride)
        return self.op("Relu", [self.op("Add", [h, shortcut])])

    def norm_scale(self, n: int) -> np.ndarray:
        return self.rng.uniform(0.8, 1.2, n).astype(np.float32)

    def small(self, n: int) -> np.ndarray:
        return (self.rng.standard_normal(n) * 0.1).astype(np.float32)


def _input(name: str, shape, elem_type: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _ints(values) -> np.ndarray:
    return np.asarray(values, np.int64)


def mlp(seed: int = 0, batch: int = 16, features: int = 128, hidden: int = 256, classes: int = 10):
    """x (batch, features) -> Gemm, Relu, Gemm (transB), Relu, MatMul + Add, Softmax."""
    g = _Graph(seed)
    h = g.op("Gemm", ["x", g.weight("w", (features, hidden)), g.const("b", g.small(hidden))])
    h = g.op("Relu", [h])
    h = g.op("Relu", [g.op("Gemm", [h, g.weight("w_t", (hidden, hidden)), g.const("b", g.small(hidden))], transB=1)])
    logits = g.linear(h, hidden, classes)
    model = g.model("mlp", [_input("x", ["batch", features])], g.op("Softmax", [logits], axis=-1),
                    ["batch", classes], opset=18)
    return model, {"x": g.rng.standard_normal((batch, features)).astype(np.float32)}


def resnet(seed: int = 0, batch: int = 2, size: int = 32, width: int = 16, classes: int = 10):
    """x (batch, 3, size, size): a stem, a basic residual block, a strided block
    with a projection shortcut, global pooling and a classifier."""
    g = _Graph(seed)
    h = g.op("Relu", [g.conv_bn("x", 3, width, 3)])
    h = g.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    h = g.basic_block(h, width, width, 1)
    h = g.basic_block(h, width, 2 * width, 2)
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1)
    logits = g.op("Gemm", [h, g.weight("fc_w", (classes, 2 * width), fan_in=2 * width),
                           g.const("fc_b", g.small(classes))], transB=1)
    model = g.model("resnet", [_input("x", ["batch", 3, size, size])], logits, ["batch", classes], opset=19)
    return model, {"x": g.rng.standard_normal((batch, 3, size, size)).astype(np.float32)}


def transformer_encoder(seed: int = 0, batch: int = 2, seq: int = 32, d_model: int = 128, heads: int = 4,
                        ff: int = 512):
    """x (batch, seq, d_model) -> x + Attention(LayerNorm(x)), then + FF(LayerNorm(.))
    with a Gelu feed-forward. The head reshapes take (batch, seq) from Shape(x)."""
    g = _Graph(seed)
    head = d_model // heads

    def layer_norm(x):
        return g.op("LayerNormalization", [x, g.const("ln_scale", g.norm_scale(d_model)),
                                           g.const("ln_b", g.small(d_model))], axis=-1, epsilon=1e-5)

    # (batch, seq) from the input's shape: shape arithmetic the host folds.
    batch_seq = g.op("Slice", [g.op("Shape", ["x"]), g.const("start", _ints([0])), g.const("end", _ints([2]))])
    split_shape = g.op("Concat", [batch_seq, g.const("heads", _ints([heads, head]))], axis=0)
    merge_shape = g.op("Concat", [batch_seq, g.const("hidden", _ints([d_model]))], axis=0)

    def split_heads(x, perm):  # (batch, seq, d_model) -> (batch, heads, seq, head) or its key layout
        return g.op("Transpose", [g.op("Reshape", [x, split_shape])], perm=perm)

    h = layer_norm("x")
    q = split_heads(g.linear(h, d_model, d_model), [0, 2, 1, 3])
    k = split_heads(g.linear(h, d_model, d_model), [0, 2, 3, 1])
    v = split_heads(g.linear(h, d_model, d_model), [0, 2, 1, 3])
    scores = g.op("Mul", [g.op("MatMul", [q, k]), g.const("scale", np.float32(1 / math.sqrt(head)))])
    attended = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    merged = g.op("Reshape", [g.op("Transpose", [attended], perm=[0, 2, 1, 3]), merge_shape])
    x1 = g.op("Add", ["x", g.linear(merged, d_model, d_model)])
    hidden = g.op("Gelu", [g.linear(layer_norm(x1), d_model, ff)])
    y = g.op("Add", [x1, g.linear(hidden, ff, d_model)])
    model = g.model("transformer_encoder", [_input("x", ["batch", "seq", d_model])], y,
                    ["batch", "seq", d_model], opset=20)
    return model, {"x": g.rng.standard_normal((batch, seq, d_model)).astype(np.float32)}


def llama_decoder(seed: int = 0, batch: int = 2, seq: int = 32, d_model: int = 128, q_heads: int = 8,
                  kv_heads: int = 2, ff: int = 344, max_position: int = 128, theta: float = 10000.0):
    """x (batch, seq, d_model), position_ids (batch, seq) -> a decoder block:
    x + Attention(RoPE(q), RoPE(k), v) over RMSNorm(x), causal with grouped
    query heads, then + SwiGLU(RMSNorm(.))."""
    g = _Graph(seed)
    head = d_model // q_heads

    def rms_norm(x):
        return g.op("RMSNormalization", [x, g.const("rms_scale", g.norm_scale(d_model))], axis=-1, epsilon=1e-6)

    inverse_frequencies = theta ** (-np.arange(0, head, 2) / head)
    angles = np.arange(max_position)[:, None] * inverse_frequencies[None, :]  # (max_position, head / 2)
    cos = g.const("cos_cache", np.cos(angles).astype(np.float32))
    sin = g.const("sin_cache", np.sin(angles).astype(np.float32))

    h = rms_norm("x")
    q = g.op("RotaryEmbedding", [g.linear(h, d_model, q_heads * head, bias=False), cos, sin, "position_ids"],
             num_heads=q_heads)
    k = g.op("RotaryEmbedding", [g.linear(h, d_model, kv_heads * head, bias=False), cos, sin, "position_ids"],
             num_heads=kv_heads)
    v = g.linear(h, d_model, kv_heads * head, bias=False)
    attended = g.op("Attention", [q, k, v], is_causal=1, q_num_heads=q_heads, kv_num_heads=kv_heads)
    x1 = g.op("Add", ["x", g.linear(attended, q_heads * head, d_model, bias=False)])
    h2 = rms_norm(x1)
    gate = g.linear(h2, d_model, ff, bias=False)
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
    up = g.linear(h2, d_model, ff, bias=False)
    y = g.op("Add", [x1, g.linear(g.op("Mul", [silu, up]), ff, d_model, bias=False)])
    model = g.model("llama_decoder", [_input("x", ["batch", "seq", d_model]),
                                      _input("position_ids", ["batch", "seq"], TensorProto.INT64)], y,
                    ["batch", "seq", d_model], opset=23)
    # Each sequence starts at its own offset, as in a batch of continued prompts.
    starts = g.rng.integers(0, max_position - seq, batch)
    position_ids = (starts[:, None] + np.arange(seq)[None, :]).astype(np.int64)
    return model, {"x": g.rng.standard_normal((batch, seq, d_model)).astype(np.float32),
                   "position_ids": position_ids}


def unet(seed: int = 0, batch: int = 1, size: int = 32, base: int = 8, classes: int = 2):
    """x (batch, 3, size, size) -> per-pixel logits (batch, classes, size, size):
    two down levels (Conv, MaxPool), one up by ConvTranspose and one by Resize
    (bilinear), each concatenated with the skip connection of its level."""
    g = _Graph(seed)

    def conv_relu(x, c_in, c_out):
        return g.op("Relu", [g.conv(x, c_in, c_out, 3)])

    e1 = conv_relu(conv_relu("x", 3, base), base, base)
    e2 = g.op("MaxPool", [e1], kernel_shape=[2, 2], strides=[2, 2])
    e2 = conv_relu(conv_relu(e2, base, 2 * base), 2 * base, 2 * base)
    bottom = g.op("MaxPool", [e2], kernel_shape=[2, 2], strides=[2, 2])
    bottom = conv_relu(bottom, 2 * base, 4 * base)
    up2 = g.op("ConvTranspose", [bottom, g.weight("up_w", (4 * base, 2 * base, 2, 2), fan_in=4 * base),
                                 g.const("up_b", g.small(2 * base))], kernel_shape=[2, 2], strides=[2, 2])
    d2 = conv_relu(g.op("Concat", [up2, e2], axis=1), 4 * base, 2 * base)
    up1 = g.op("Resize", [d2, "", g.const("scales", np.array([1, 1, 2, 2], np.float32))], mode="linear")
    up1 = g.conv(up1, 2 * base, base, 1)
    d1 = conv_relu(g.op("Concat", [up1, e1], axis=1), 2 * base, base)
    logits = g.conv(d1, base, classes, 1)
    model = g.model("unet", [_input("x", ["batch", 3, size, size])], logits, ["batch", classes, size, size],
                    opset=19)
    return model, {"x": g.rng.standard_normal((batch, 3, size, size)).astype(np.float32)}


def resnet18(seed: int = 0, batch: int = 1, size: int = 224, classes: int = 1000):
    """x (batch, 3, size, size) -> logits: torchvision's ResNet-18 layout
    (7x7 stem, four stages of two basic blocks, 64 to 512 channels)."""
    g = _Graph(seed)
    h = g.op("Relu", [g.conv_bn("x", 3, 64, 7, 2)])
    h = g.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        h = g.basic_block(g.basic_block(h, channels, width, stride), width, width, 1)
        channels = width
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1)
    logits = g.op("Gemm", [h, g.weight("fc_w", (classes, channels), fan_in=channels),
                           g.const("fc_b", g.small(classes))], transB=1)
    model = g.model("resnet18", [_input("x", ["batch", 3, size, size])], logits, ["batch", classes], opset=19)
    return model, {"x": g.rng.standard_normal((batch, 3, size, size)).astype(np.float32)}


def gpt(seed: int = 0, layers: int = 4, seq: int = 128, d_model: int = 256, heads: int = 4):
    """x (1, seq, d_model) token embeddings -> ``layers`` pre-norm decoder
    blocks (causal multi-head attention, a 4x Gelu MLP) and a final LayerNorm."""
    g = _Graph(seed)
    head = d_model // heads
    mask = g.const("causal_mask", np.triu(np.full((seq, seq), -1e9, np.float32), k=1))
    split_shape = g.const("split_shape", _ints([1, seq, heads, head]))
    merge_shape = g.const("merge_shape", _ints([1, seq, d_model]))

    def layer_norm(x):
        return g.op("LayerNormalization", [x, g.const("ln_scale", g.norm_scale(d_model)),
                                           g.const("ln_b", g.small(d_model))], axis=-1, epsilon=1e-5)

    def heads_of(x, perm):
        return g.op("Transpose", [g.op("Reshape", [x, split_shape])], perm=perm)

    x = "x"
    for _ in range(layers):
        h = layer_norm(x)
        q = heads_of(g.linear(h, d_model, d_model), [0, 2, 1, 3])
        k = heads_of(g.linear(h, d_model, d_model), [0, 2, 3, 1])
        v = heads_of(g.linear(h, d_model, d_model), [0, 2, 1, 3])
        scores = g.op("Mul", [g.op("MatMul", [q, k]), g.const("scale", np.float32(1 / math.sqrt(head)))])
        attended = g.op("MatMul", [g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1), v])
        merged = g.op("Reshape", [g.op("Transpose", [attended], perm=[0, 2, 1, 3]), merge_shape])
        x = g.op("Add", [x, g.linear(merged, d_model, d_model)])
        x = g.op("Add", [x, g.linear(g.op("Gelu", [g.linear(layer_norm(x), d_model, 4 * d_model)]),
                                     4 * d_model, d_model)])
    model = g.model("gpt", [_input("x", [1, seq, d_model])], layer_norm(x), [1, seq, d_model], opset=20)
    return model, {"x": g.rng.standard_normal((1, seq, d_model)).astype(np.float32)}


MODELS: dict[str, Callable] = {
    "mlp": mlp,
    "resnet": resnet,
    "transformer_encoder": transformer_encoder,
    "llama_decoder": llama_decoder,
    "unet": unet,
}

LARGE_MODELS: dict[str, Callable] = {
    "resnet18": resnet18,
    "gpt": gpt,
}

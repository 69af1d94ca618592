"""devkit-bench: benchmarks against a named peer measured in the same run.

    devkit-bench ops [--plugin cpu] [--only Add,MatMul] [--json PATH]   (devkit.bench.ops)
    devkit-bench opencl [--repeat 10] [--json PATH]                      (devkit.bench.opencl)
    devkit-bench cuda [--repeat 10] [--json PATH]                        (devkit.bench.cuda)
    devkit-bench torch [--plugin cpu] [--repeat 7] [--json PATH]         (devkit.bench.torch)
    devkit-bench engine [--plugins cpu,opencl] [--only eager,chain,models,host] (devkit.bench.engine)
                        [--models mlp,gpt] [--repeat 15] [--quick] [--json PATH]
    devkit-bench fusion [--plugins cpu,opencl] [--rows 256] [--width 2048]  (devkit.bench.fusion)
                        [--repeat 15] [--no-models] [--json PATH]
    devkit-bench collectives [-n 2] [--plugin cpu] [--dtype float32]     (devkit.bench.collectives)
                             [--min-bytes 1K] [--max-bytes 64M] [--peer gloo|none] [--json PATH]

Each subcommand lives in its own module; this one only parses the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .collectives import COLLECTIVES, RANK_COMMAND, collectives_main, parse_bytes, rank_main


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [RANK_COMMAND]:  # what each launched rank runs; not for users
        rank = argparse.ArgumentParser(prog=f"devkit-bench {RANK_COMMAND}")
        rank.add_argument("--backend", choices=("devkit", "gloo"), required=True)
        rank.add_argument("--config", required=True)
        rank.add_argument("--out", required=True)
        sys.exit(rank_main(rank.parse_args(argv[1:])))
    parser = argparse.ArgumentParser(prog="devkit-bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("collectives", help="collective bandwidth, nccl-tests style, vs gloo")
    bench.add_argument("-n", "--nranks", type=int, default=2)
    bench.add_argument("--plugin", default="cpu")
    bench.add_argument("--dtype", default="float32", choices=("float32", "float64", "int32", "int64"))
    bench.add_argument("--min-bytes", type=parse_bytes, default=1 << 10)
    bench.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    bench.add_argument("--collectives", default=",".join(COLLECTIVES),
                       help="comma-separated subset of " + ", ".join(COLLECTIVES))
    bench.add_argument("--peer", choices=("gloo", "none"), default="gloo")
    bench.add_argument("--seconds", type=float, default=0.2,
                       help="time to spend on each measurement (default 0.2)")
    bench.add_argument("--max-iters", type=int, default=1000)
    bench.add_argument("--timeout", type=float, default=1800, help="seconds for each launch")
    bench.add_argument("--json", help="also write the results to this file")
    op_bench = commands.add_parser("ops", help="op latency vs NumPy and onnxruntime")
    op_bench.add_argument("--plugin", default="cpu")
    op_bench.add_argument("--only", help="comma-separated op names (default: every benchmark)")
    op_bench.add_argument("--repeat", type=int, default=10)
    op_bench.add_argument("--json", type=Path, help="also write the results to this file")
    opencl_bench = commands.add_parser("opencl", help="the opencl plugin vs pyopencl.array and CLBlast, "
                                                      "and its start-up time")
    opencl_bench.add_argument("--repeat", type=int, default=10)
    opencl_bench.add_argument("--json", type=Path, help="also write the results to this file")
    cuda_bench = commands.add_parser("cuda", help="the cuda plugin: Add vs copy bandwidth, MatMul 8192^2 vs "
                                                  "cupy.matmul (skipped, with the reason, without a GPU)")
    cuda_bench.add_argument("--repeat", type=int, default=10)
    cuda_bench.add_argument("--json", type=Path, help="also write the results to this file")
    torch_bench = commands.add_parser("torch", help="devkit.torch eager overhead per aten op and the "
                                                    "torch.compile path vs torch's CPU")
    torch_bench.add_argument("--plugin", default="cpu")
    torch_bench.add_argument("--repeat", type=int, default=7)
    torch_bench.add_argument("--json", type=Path, help="also write the results to this file")
    engine_bench = commands.add_parser("engine", help="eager ops, plans and the interpreter vs torch, NumPy "
                                                      "and onnxruntime: host cost per op and per model")
    engine_bench.add_argument("--plugins", default="cpu", help="comma-separated plugins (default: cpu)")
    engine_bench.add_argument("--only", default="eager,chain,models",
                              help="comma-separated subset of eager, chain, models, host (a run's host cost "
                                   "by stage; --models picks zoo models, default mlp)")
    engine_bench.add_argument("--models", help="comma-separated zoo models (default: zoo.MODELS and zoo.LARGE_MODELS)")
    engine_bench.add_argument("--repeat", type=int, default=15)
    engine_bench.add_argument("--quick", action="store_true", help="a short run: 20 chain nodes, two small models")
    engine_bench.add_argument("--json", type=Path, help="also write the results to this file")
    fusion_bench = commands.add_parser("fusion", help="fused plans vs unfused ones and native kernels: RMSNorm, "
                                                      "LayerNorm, tanh-GELU, SwiGLU, llama_decoder, gpt")
    fusion_bench.add_argument("--plugins", default="cpu", help="comma-separated plugins (default: cpu)")
    fusion_bench.add_argument("--rows", type=int, default=256)
    fusion_bench.add_argument("--width", type=int, default=2048)
    fusion_bench.add_argument("--repeat", type=int, default=15)
    fusion_bench.add_argument("--no-models", action="store_true", help="the four patterns only")
    fusion_bench.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    # Each subcommand's module is imported when it runs: the collectives ranks (python -m
    # devkit.bench _rank, one process per rank) import none of them, nor the ONNX side
    # (devkit.onnx and onnx: about 0.1 s a rank) that engine, ops, cuda and fusion import.
    if args.command == "fusion":
        from .fusion import fusion_main

        sys.exit(fusion_main(args))
    if args.command == "torch":
        from .torch import torch_main

        sys.exit(torch_main(args))
    if args.command == "engine":
        from .engine import engine_main

        sys.exit(engine_main(args))
    if args.command == "opencl":
        from .opencl import opencl_main

        sys.exit(opencl_main(args))
    if args.command == "cuda":
        from .cuda import cuda_main

        sys.exit(cuda_main(args))
    if args.command == "ops":
        from .ops import ops_main

        sys.exit(ops_main(args))
    if args.nranks < 1 or args.min_bytes < 1 or args.max_bytes < args.min_bytes:
        parser.error("need -n >= 1 and 1 <= --min-bytes <= --max-bytes")
    sys.exit(collectives_main(args))



"""Per-layer time of ResNet-18 (devkit.onnx.zoo.resnet18, 224x224, batch 1)
on the cpu plugin against onnxruntime's own per-node profile.

    python scripts/profile-resnet18.py [--repeat 5] [--rounds 5] [--threads 1,2]

devkit: Plan.profile (each call launched alone, warm). onnxruntime:
SessionOptions.enable_profiling, its per-node kernel times with 1 and 2
intra-op threads, spinning off, and per node the faster of them. The two
are interleaved: --rounds rounds of a devkit profile of --repeat passes and
--repeat runs of each onnxruntime session; medians over all. Conv nodes are matched in graph order
(both run the BatchNormalization-folded Convs, each with its Relu/Add fused
or not); the rest is summed per op. Rows: ms devkit, ms onnxruntime,
ratio devkit / onnxruntime (above 1: devkit is slower).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile

import numpy as np


def _conv_label(x_shape, w_shape, strides) -> str:
    return (f"{x_shape[1]}@{x_shape[2]}x{x_shape[3]} k{w_shape[2]}"
            f"{' s' + str(strides) if strides != 1 else ''} -> {w_shape[0]}")


def _ort_session(model, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ort_nodes(session, skip):
    """Per node in graph order: (op, name, median seconds over the profiled runs after the first ``skip``)."""
    with open(session.end_profiling()) as f:
        events = json.load(f)
    per_node = collections.defaultdict(list)
    order, ops = [], {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in ops:
            order.append(name)
            ops[name] = e["args"]["op_name"]
        per_node[name].append(e["dur"] * 1e-6)
    return [(ops[n], n, statistics.median(per_node[n][skip:])) for n in order]


def profiles(model, feed, repeat, threads, rounds=5):
    """devkit's per-call times (Plan.profile) and onnxruntime's per-node ones,
    interleaved in ``rounds`` (each: a devkit profile of ``repeat`` passes,
    then ``repeat`` runs of each onnxruntime session), so a shared machine's
    load falls on both alike; medians over all."""
    from devkit import onnx as donnx

    prepared = donnx.prepare(model, "cpu:0")
    prepared.run(feed)
    (plan,) = prepared.plans.values()
    sessions = {t: _ort_session(model, t) for t in threads}
    warm = 3
    for session in sessions.values():
        for _ in range(warm):
            session.run(None, feed)
    samples: list[list[float]] = [[] for _ in plan.calls]
    for _ in range(rounds):
        for spent, (_, seconds) in zip(samples, plan.profile(feed, repeat)):
            spent.append(seconds)
        for session in sessions.values():
            for _ in range(repeat):
                session.run(None, feed)
    ours = []
    for call, spent in zip(plan.calls, samples):
        label = call.op
        if call.op in ("Conv", "FusedConv"):
            x = [call.inputs[0].shape[d] for d in range(call.inputs[0].ndim)]
            w = [call.inputs[1].shape[d] for d in range(call.inputs[1].ndim)]
            strides = dict((name, value) for name, _, value in call.attributes).get("strides", [1, 1])
            label = _conv_label(x, w, list(strides)[0])
        ours.append((call.op, label, statistics.median(spent)))
    theirs = {t: [(op, name, None, seconds) for op, name, seconds in _ort_nodes(session, warm)]
              for t, session in sessions.items()}
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    from devkit.onnx import zoo

    model, feed = zoo.resnet18()
    ours, theirs = profiles(model, feed, args.repeat, [int(t) for t in args.threads.split(",")], args.rounds)
    convs = {t: [r for r in rows if r[0] in ("Conv", "FusedConv")] for t, rows in theirs.items()}
    our_convs = [r for r in ours if r[0] in ("Conv", "FusedConv")]
    print(f"load {os.getloadavg()[0]:.2f}; onnxruntime threads {args.threads}")
    head = " ".join(f"ort{t}t" for t in theirs)
    print(f"{'layer':28s} {'devkit':>7s} {head} {'best':>6s} ratio")
    total_ours = total_best = 0.0
    for i, (_, label, seconds) in enumerate(our_convs):
        peer = [convs[t][i][3] if i < len(convs[t]) else float("nan") for t in theirs]
        best = min(peer)
        total_ours += seconds
        total_best += best
        cols = " ".join(f"{p * 1e3:5.3f}" for p in peer)
        print(f"{label:28s} {seconds * 1e3:7.3f} {cols} {best * 1e3:6.3f} {seconds / best:5.2f}")
    print(f"{'convs':28s} {total_ours * 1e3:7.3f} {'':{len(head)}s} {total_best * 1e3:6.3f} "
          f"{total_ours / total_best:5.2f}")
    rest = collections.Counter()
    for op, _, seconds in ours:
        if op not in ("Conv", "FusedConv"):
            rest[op] += seconds
    peer_rest = {t: collections.Counter() for t in theirs}
    for t, rows in theirs.items():
        for op, _, _, seconds in rows:
            if op not in ("Conv", "FusedConv"):
                peer_rest[t][op] += seconds
    print("other ops (devkit):", ", ".join(f"{op} {s * 1e3:.3f}" for op, s in rest.items()))
    for t in theirs:
        print(f"other ops (ort {t}t):", ", ".join(f"{op} {s * 1e3:.3f}" for op, s in peer_rest[t].items()))
    for t in theirs:
        print(f"total ort {t}t node time {sum(r[3] for r in theirs[t]) * 1e3:.3f} ms; devkit "
              f"{sum(r[2] for r in ours) * 1e3:.3f} ms")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()

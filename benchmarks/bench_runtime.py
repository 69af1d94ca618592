"""Runtime micro-benchmarks, each against a named peer measured in the same run.

- ABI call round trip: the median time of ``stream_query`` called from Python,
  raw through the cffi table and through ``devkit.Stream.query``; the peer is
  a no-op cffi call into libc (``abs``), the floor of any cffi call.
- Copy bandwidth: H2D and D2H of 64 MiB through the plugin, as a ratio to
  ``numpy.copyto`` of the same size.

Usage: python benchmarks/bench_runtime.py [--plugin cpu] [--json out.json]
"""

import argparse
import json
import statistics
import time

import cffi
import numpy as np

import devkit


def per_call_ns(fn, calls=200, batches=200) -> float:
    """Median over batches of the mean time per call, in ns."""
    for _ in range(calls):
        fn()
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(samples)


def median_seconds(fn, repeats=15) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", default="cpu")
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    plugin = devkit.load_plugin(args.plugin)
    dev = plugin.device(0)
    stream = dev.create_stream()
    query, index, handle = plugin.api.stream_query, dev.index, stream.handle
    libc_ffi = cffi.FFI()
    libc_ffi.cdef("int abs(int);")
    libc = libc_ffi.dlopen(None)

    results = {
        "plugin": plugin.name,
        "stream_query_raw_ns": per_call_ns(lambda: query(index, handle)),
        "stream_query_api_ns": per_call_ns(stream.query),
        "cffi_noop_ns": per_call_ns(lambda: libc.abs(-1)),
    }

    size = args.size_mib << 20
    host_src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    host_dst = np.zeros(size, np.uint8)
    buffer = dev.alloc(size)
    buffer.fill(0)
    h2d = median_seconds(lambda: buffer.copy_from_host(host_src))
    d2h = median_seconds(lambda: buffer.copy_to_host(host_dst))
    numpy_copy = median_seconds(lambda: np.copyto(host_dst, host_src))
    assert np.array_equal(host_dst, host_src)
    gbps = lambda seconds: size / seconds / 1e9  # noqa: E731
    results.update({
        "copy_bytes": size,
        "h2d_GBps": gbps(h2d), "d2h_GBps": gbps(d2h), "numpy_copyto_GBps": gbps(numpy_copy),
        "h2d_vs_numpy": numpy_copy / h2d, "d2h_vs_numpy": numpy_copy / d2h,
    })
    stream.destroy()

    print(f"plugin {plugin.name}: {plugin!r}")
    print(f"stream_query round trip (median): raw table {results['stream_query_raw_ns']:.0f} ns, "
          f"Stream.query {results['stream_query_api_ns']:.0f} ns "
          f"(peer: cffi no-op libc abs {results['cffi_noop_ns']:.0f} ns)")
    print(f"{args.size_mib} MiB copies: H2D {results['h2d_GBps']:.2f} GB/s, "
          f"D2H {results['d2h_GBps']:.2f} GB/s, numpy.copyto {results['numpy_copyto_GBps']:.2f} GB/s")
    print(f"ratio to numpy.copyto (higher is faster): H2D {results['h2d_vs_numpy']:.2f}x, "
          f"D2H {results['d2h_vs_numpy']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

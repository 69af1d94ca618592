#!/usr/bin/env bash
# The cuda plugin on a GPU machine, offline: builds devkit with the image's
# python3 (cupy-cuda13x, onnx, onnxruntime and pytest preinstalled; nothing
# is installed from a network), compiles every kernel program through the
# plugin's own NVRTC path (which fills devkit's kernel cache, so nothing after
# it compiles), then runs the runtime, graphs, ops (quick), onnx-node and
# models conformance on cuda, the cuda tests and devkit-bench cuda, and
# writes every result under RESULTS_DIR. Budget: under 9 minutes on one H200; the step
# timeouts add up to 510 s, so the whole run ends within it even when a step
# hangs (on 2026-12-04 the install took 77 s, NVRTC 17 s, the quick ops and
# models suites 47 s; the runtime and graphs suites ran past 60 s on 8 workers).
#   ci/gpu-check.sh [RESULTS_DIR]     (default: results/gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-results/gpu-check}
mkdir -p "$results"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
status=0
step() {  # step NAME SECONDS COMMAND...: runs it, logs it, keeps going
    local name=$1 seconds=$2
    shift 2
    local start=$SECONDS
    echo "== $name" | tee -a "$results/summary.txt"
    if timeout "$seconds" "$@" > "$results/$name.log" 2>&1; then
        echo "   ok ($((SECONDS - start)) s)" | tee -a "$results/summary.txt"
    else
        echo "   FAILED (exit $?, $((SECONDS - start)) s of $seconds; see $name.log)" | tee -a "$results/summary.txt"
        status=1
    fi
    tail -3 "$results/$name.log" | sed 's/^/   /' >> "$results/summary.txt"
}
: > "$results/summary.txt"
# Packages the image lacks (cffi and scipy-openblas32 on 2026-12-04) travel as
# wheels in .whl (docs/cuda.md says how to fetch them); the build sees them too.
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-deps --no-compile --upgrade --target /tmp/devkit-site .whl/*.whl \
        && export PYTHONPATH=/tmp/devkit-site${PYTHONPATH:+:$PYTHONPATH}
fi
step environment 20 bash -c 'nvidia-smi; python3 --version; python3 -c "import cupy; print(\"cupy\", cupy.__version__); cupy.show_config()"'
# The editable install builds the cpu plugin's C library (setuptools, wheel and
# scipy-openblas32 are the build requirements; --no-build-isolation uses the
# image's, --no-deps installs nothing else).
step install 100 python3 -m pip install --no-deps --no-build-isolation -e .
step plugins 20 python3 -c "import devkit; [print(d) for d in devkit.list_plugins()]; devkit.load_plugin('cuda')"
# NVRTC through CuPy for this GPU's architecture, 16 processes; nvcc need not be installed.
step kernel-nvrtc 50 python3 -m devkit.backends.cuda.check --nvrtc --jobs 16
export DEVKIT_TEST_PLUGINS=cuda
step runtime 100 devkit-conformance cuda --suite runtime --suite graphs --workers 16 \
    --report "$results/runtime.md" --junit "$results/runtime.xml"
# Ops the plugin has no kernel for are skipped by the op suite (and reported).
step suites 150 devkit-conformance cuda --profile quick --workers 16 --suite ops --suite onnx-node \
    --suite models --report "$results/conformance.md" --junit "$results/conformance.xml"
step cuda-tests 40 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_cuda.py \
    tests/test_cuda_kernels.py tests/test_cuda_graphs.py --junitxml="$results/test_cuda.xml"
# Add 256 Mi float32 vs the D2D copy bandwidth, MatMul 8192^2 f32/bf16 vs cupy.matmul.
step bench 50 devkit-bench cuda --repeat 10 --json "$results/bench-cuda.json"
echo "results in $results (exit $status)"
exit $status

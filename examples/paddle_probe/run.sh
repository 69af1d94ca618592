#!/usr/bin/env bash
# The first step of issue #34: PaddlePaddle's PyPI CPU wheel loads a custom
# device. Builds devkit_plugin.cc (device type "devkit", host-malloc memory,
# one float32 relu kernel through the phi C API) against the installed
# wheel's headers, then runs run_probe.py with CUSTOM_DEVICE_ROOT set (it
# must be set before paddle is imported). Needs: pip install paddlepaddle==3.3.1.
# The plugin must link libphi_core.so: without it `import paddle` dies on
# the undefined PD_RegisterPhiKernel (exit 127, no Python exception).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PY:-python3}"
INC="$("$PY" -W ignore -c 'import paddle; print(paddle.sysconfig.get_include())')"
PKG="$("$PY" -W ignore -c 'import paddle, os; print(os.path.dirname(paddle.__file__))')"
OUT="$(mktemp -d)"
g++ -std=c++17 -O2 -fPIC -shared -I"$INC" -I"$INC/third_party" "$HERE/devkit_plugin.cc" \
    -o "$OUT/libpaddle-devkit.so" -L"$PKG/libs" -l:libphi_core.so -Wl,-rpath,"$PKG/libs"
CUSTOM_DEVICE_ROOT="$OUT" "$PY" -W ignore "$HERE/run_probe.py"

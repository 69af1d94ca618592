#!/usr/bin/env bash
# Installs an OpenCL device for the opencl plugin's tests (Debian/Ubuntu): the
# PoCL CPU driver, the ICD loader and its headers, clinfo to list devices,
# and pyopencl, the plugin's only Python dependency (into the active Python
# environment: the `opencl` extra).
set -euo pipefail
missing=()
dpkg -s pocl-opencl-icd >/dev/null 2>&1 || missing+=(pocl-opencl-icd)
dpkg -s ocl-icd-opencl-dev >/dev/null 2>&1 || missing+=(ocl-icd-opencl-dev)
command -v clinfo >/dev/null 2>&1 || missing+=(clinfo)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi
python3 -c 'import pyopencl' 2>/dev/null || python3 -m pip install 'pyopencl>=2024.1'

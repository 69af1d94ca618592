#!/usr/bin/env bash
# Installs the system packages the build and the tests need (Debian/Ubuntu):
# a C and a C++ compiler (the cpu plugin, the test plugins, the header check),
# and Open MPI (the test that runs collectives under mpirun; mpi4py builds
# against it when no wheel fits).
set -euo pipefail
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || missing+=(libopenmpi-dev)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi

#!/usr/bin/env bash
# Installs the system packages the build and the tests need (Debian/Ubuntu):
# a C and a C++ compiler (the cpu plugin, the test plugins, the header check).
set -euo pipefail
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi

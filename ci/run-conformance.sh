#!/usr/bin/env bash
# Certify a plugin in any CI: install devkit and the plugin, run devkit-conformance
# against it, and leave JUnit XML (for the CI to show), JSON and Markdown reports.
#
#   ci/run-conformance.sh PLUGIN [PIP_SPEC_OF_YOUR_PLUGIN_PACKAGE]
#
# PLUGIN is a plugin name (found like devkit.load_plugin finds it) or a path to
# the plugin library. Reports go to ${DEVKIT_REPORT_DIR:-reports}/. More options
# for devkit-conformance (say "--profile full --expect-fail known-failures.txt")
# come from DEVKIT_CONFORMANCE_OPTIONS. The exit status is devkit-conformance's.
set -euo pipefail
plugin=${1:?usage: run-conformance.sh PLUGIN [PIP_SPEC]}
devkit_root=$(cd "$(dirname "$0")/.." && pwd)
report_dir=${DEVKIT_REPORT_DIR:-reports}
mkdir -p "$report_dir"
python3 -m pip install "$devkit_root"
if [ $# -ge 2 ]; then python3 -m pip install "$2"; fi
# shellcheck disable=SC2086  # the options are meant to split into words
devkit-conformance "$plugin" ${DEVKIT_CONFORMANCE_OPTIONS:-} \
  --junit "$report_dir/conformance-junit.xml" --json "$report_dir/conformance.json" \
  --report "$report_dir/conformance.md"

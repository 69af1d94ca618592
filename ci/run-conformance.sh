#!/usr/bin/env bash
# Certify a plugin in any CI: install devkit and the plugin, run the
# conformance suite against it, and leave a JUnit XML report for the CI to show.
#
#   ci/run-conformance.sh PLUGIN [PIP_SPEC_OF_YOUR_PLUGIN_PACKAGE]
#
# PLUGIN is a plugin name (found like devkit.load_plugin finds it) or a path to
# the plugin library. Reports go to ${DEVKIT_REPORT_DIR:-reports}/.
set -euo pipefail
plugin=${1:?usage: run-conformance.sh PLUGIN [PIP_SPEC]}
devkit_root=$(cd "$(dirname "$0")/.." && pwd)
report_dir=${DEVKIT_REPORT_DIR:-reports}
mkdir -p "$report_dir"
python3 -m pip install "${devkit_root}[test]"
if [ $# -ge 2 ]; then python3 -m pip install "$2"; fi
python3 -c "import devkit, sys; p = devkit.load_plugin(sys.argv[1]); print(repr(p))" "$plugin"
DEVKIT_TEST_PLUGINS="$plugin" python3 -m pytest "$devkit_root/conformance" \
  --junitxml="$report_dir/conformance-junit.xml" -o junit_suite_name="devkit-conformance-$(basename "$plugin")"

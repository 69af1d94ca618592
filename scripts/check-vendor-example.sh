#!/usr/bin/env bash
# CI: the out-of-tree example plugin (examples/vendor_plugin, what `devkit
# new-plugin acme` writes) builds against the installed devkit and installs as
# a separate package, devkit.load_plugin("acme") finds it through its entry
# point, and it passes the conformance suites its CI workflow runs (runtime,
# robustness, graphs).
#
#   scripts/check-vendor-example.sh REPORT_DIR
#
# Writes REPORT_DIR/acme-junit.xml and REPORT_DIR/acme.md. The plugin goes into
# a throwaway virtual environment layered on the current one (which has devkit
# installed), so the current environment is left as it was. The exit status is
# devkit-conformance's.
set -euo pipefail
report_dir=${1:?usage: check-vendor-example.sh REPORT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT

# No pip or setuptools of its own: the venv sees the current environment's
# packages, pip, setuptools and devkit among them. (--system-site-packages
# would not do: inside a virtual environment it reaches the base interpreter's
# packages, not the environment's.)
python3 -m venv --without-pip "$venv"
outer=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
inner=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$outer')" > "$inner/outer-environment.pth"

# From a copy: the build leaves build/ and *.egg-info in the source tree.
# Without build isolation, as the example's README says: its setup.py compiles
# the support library of the devkit it imports, the current environment's.
# setuptools 70.1 builds wheels without the wheel package; where the current
# environment has it, nothing is fetched.
cp -r "$root/examples/vendor_plugin" "$venv/vendor_plugin"
"$venv/bin/python" -m pip install --quiet "setuptools>=70.1"
"$venv/bin/python" -m pip install --quiet --no-build-isolation "$venv/vendor_plugin"
# Found by name through the entry point, not through a plugin directory.
unset DEVKIT_PLUGIN_PATH
"$venv/bin/python" - <<'EOF'
import devkit
plugin = devkit.load_plugin("acme")
assert plugin.source == "entry point", f"acme was found as {plugin.source}, not through its entry point"
print(f"loaded {plugin!r} through its entry point")
EOF
mkdir -p "$report_dir"
"$venv/bin/python" -m devkit.conformance_cli acme --suite runtime --suite robustness --suite graphs \
  --junit "$report_dir/acme-junit.xml" --report "$report_dir/acme.md"

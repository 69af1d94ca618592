#!/usr/bin/env bash
# CI: the out-of-tree example plugin (examples/vendor_plugin, the "Acme NPU")
# installs as a separate package, devkit.load_plugin("acme") finds it through
# its entry point, and it passes devkit-conformance's runtime suite.
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

python3 -m venv "$venv"
# The venv sees the current environment's packages, devkit among them, behind
# its own. (--system-site-packages would not do: inside a virtual environment
# it reaches the base interpreter's packages, not the environment's.)
outer=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
inner=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$outer')" > "$inner/outer-environment.pth"

# From a copy: the build leaves build/ and *.egg-info in the source tree.
cp -r "$root/examples/vendor_plugin" "$venv/vendor_plugin"
"$venv/bin/python" -m pip install --quiet "$venv/vendor_plugin"
# Found by name through the entry point, not through a plugin directory.
unset DEVKIT_PLUGIN_PATH
"$venv/bin/python" - <<'EOF'
import devkit
plugin = devkit.load_plugin("acme")
assert plugin.source == "entry point", f"acme was found as {plugin.source}, not through its entry point"
print(f"loaded {plugin!r} through its entry point")
EOF
mkdir -p "$report_dir"
"$venv/bin/python" -m devkit.conformance_cli acme --suite runtime \
  --junit "$report_dir/acme-junit.xml" --report "$report_dir/acme.md"

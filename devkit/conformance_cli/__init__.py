"""devkit-conformance: certify a plugin against the conformance suite.

The suite (devkit.conformance, the repository's conformance/ directory) runs in
worker processes so that a case which crashes or hangs its process is reported
and the run goes on. The command is cli.main; see docs/conformance.md.
"""

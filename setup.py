"""Builds the C parts: plugin shared libraries, which are plain C libraries
(one exported symbol, DK_PluginInit), not Python extension modules."""

import glob
import os

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class build_plugin_libraries(build_ext):
    def get_ext_filename(self, fullname):
        # devkit.backends.cpu.libdevkit_cpu -> devkit/backends/cpu/libdevkit_cpu.so
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext):
        return []  # no PyInit_*: exports come from DK_EXPORT in the sources


cpu_plugin = Extension(
    "devkit.backends.cpu.libdevkit_cpu",
    sources=sorted(glob.glob("devkit/backends/cpu/*.c")),
    include_dirs=["devkit/abi"],
    depends=["devkit/abi/devkit.h", *glob.glob("devkit/backends/cpu/*.h")],
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra"],
    extra_link_args=["-pthread"],
)

# The conformance suite stays at the top of the repository (python3 -m pytest
# runs it there) and ships inside the package as devkit.conformance, so that
# devkit-conformance works from any install.
setup(
    packages=[*find_packages(include=["devkit*"]), "devkit.conformance"],
    package_dir={"devkit.conformance": "conformance"},
    ext_modules=[cpu_plugin],
    cmdclass={"build_ext": build_plugin_libraries},
)

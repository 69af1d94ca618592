"""Builds libdevkit_@name@.so into the package devkit_plugin_@name@: a plain C
library exporting one symbol, DK_PluginInit, not a Python extension module.

The library is the project's sources plus devkit's plugin-support library,
compiled from the sources of the devkit this build imports (a build
requirement): rebuilt after an upgrade of devkit, the plugin has every fix
of the library, and the devkit.h of that devkit.

The package lives in src/ beside the C sources (a src layout), so that Python
run in the project's directory imports the installed package, which holds the
built library, not the source tree's."""

import os
from glob import glob

import devkit.abi
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class build_plugin_library(build_ext):
    def get_ext_filename(self, fullname):
        # devkit_plugin_@name@.libdevkit_@name@ -> devkit_plugin_@name@/libdevkit_@name@.so
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext):
        return []  # no PyInit_*: the export is DK_PluginInit, marked DK_EXPORT in devkit.h

    def build_extension(self, ext):
        # devkit's files join at build time only, so an sdist holds the project's own.
        ext.sources = [*ext.sources, *devkit.abi.support_sources()]
        ext.depends = [*ext.depends, *sorted(glob(os.path.join(devkit.abi.support_dir(), "*.h"))),
                       os.path.join(devkit.abi.include_dir(), "devkit.h")]
        super().build_extension(ext)


plugin = Extension(
    "devkit_plugin_@name@.libdevkit_@name@",
    sources=sorted(glob("src/*.c")) + sorted(glob("src/kernels/*.c")),
    include_dirs=["src", devkit.abi.include_dir(), devkit.abi.support_dir()],
    depends=sorted(glob("src/*.h") + glob("src/kernels/*.h")),
    # Hidden visibility: DK_PluginInit is the library's only exported symbol.
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra",
                        "-fno-math-errno"],
    extra_link_args=["-pthread", "-lm"],
)

# packages here, not in pyproject.toml: setuptools before 68 warns that [tool.setuptools] is beta.
setup(packages=["devkit_plugin_@name@"], package_dir={"": "src"}, ext_modules=[plugin],
      cmdclass={"build_ext": build_plugin_library})

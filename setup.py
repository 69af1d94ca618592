"""Builds the C parts: plugin shared libraries, which are plain C libraries
(one exported symbol, DK_PluginInit), not Python extension modules."""

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class build_plugin_libraries(build_ext):
    def get_ext_filename(self, fullname):
        # devkit.backends.cpu.libdevkit_cpu -> devkit/backends/cpu/libdevkit_cpu.so
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext):
        return []  # no PyInit_*: exports come from DK_EXPORT in the sources

    def build_extension(self, ext):
        # distutils compiles an extension's sources one after another: one
        # compiler process per source at once instead (the cpu plugin's build
        # takes minutes on one core).
        compile_sources = self.compiler.compile

        def compile_in_parallel(sources, **options):
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                objects = pool.map(lambda source: compile_sources([source], **options), sources)
                return [name for names in objects for name in names]

        self.compiler.compile = compile_in_parallel
        super().build_extension(ext)


def _load_cpu_build():
    spec = importlib.util.spec_from_file_location("cpu_build", "devkit/backends/cpu/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_build = _load_cpu_build()
blas_compile, blas_link = cpu_build.blas()
root = os.path.dirname(os.path.abspath(__file__))
cpu_plugin = Extension(
    "devkit.backends.cpu.libdevkit_cpu",
    sources=[os.path.relpath(p, root) for p in cpu_build.sources()],
    include_dirs=[os.path.relpath(p, root) for p in cpu_build.include_dirs()],
    depends=[os.path.relpath(p, root) for p in cpu_build.headers()],
    extra_compile_args=[*cpu_build.COMPILE_ARGS, *blas_compile],
    extra_link_args=["-pthread", *blas_link, "-lm"],
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

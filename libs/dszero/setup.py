"""Builds dszero's native CPU Adam kernel, and installs the package anyway when it cannot be built.

Everything declarative lives in pyproject.toml; this file exists only because an optional C++
extension (one whose failure to compile is not an install failure) needs a build_ext hook. Without
it, dszero.ops.CPUAdam runs a torch._foreach_* implementation of the same step and says so once.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from pybind11.setup_helpers import Pybind11Extension
except ImportError:  # no pybind11 in the build env: install the pure-Python package only
    Pybind11Extension = None

# -fno-math-errno lets sqrt vectorise; -ffp-contract=off keeps multiply-adds fused only where the
# kernel says so (where ATen fuses them); never -ffast-math (it would break agreement with torch) and
# never -march=native (the wheel must run on other x86-64 CPUs: ISA is chosen at run time instead).
COMPILE_ARGS = ["-O3", "-fno-math-errno", "-ffp-contract=off"]
OPENMP_ARGS = ["-fopenmp"]


class OptionalBuildExt(build_ext):
    """Tries OpenMP, then plain std::thread; a failure of both is a warning unless
    DSZERO_REQUIRE_NATIVE=1 makes it fatal."""

    def run(self):
        try:
            super().run()
        except Exception as exc:
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
            return
        except Exception as exc:
            print(f"dszero: building {ext.name} with OpenMP failed ({exc}); retrying with std::thread",
                  file=sys.stderr)
        # No OpenMP runtime: threads come from std::thread, and -fopenmp-simd still honours the
        # kernel's `omp simd` loop without needing libgomp.
        ext.extra_compile_args = [a for a in ext.extra_compile_args if a not in OPENMP_ARGS] + ["-fopenmp-simd"]
        ext.extra_link_args = [a for a in ext.extra_link_args if a not in OPENMP_ARGS]
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    def _skip(self, exc):
        if os.environ.get("DSZERO_REQUIRE_NATIVE") == "1":
            raise exc
        print(f"dszero: native CPU Adam not built ({exc}); the torch fallback will be used", file=sys.stderr)


ext_modules = []
is_x86_linux = sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "AMD64")
if Pybind11Extension is not None and is_x86_linux and os.environ.get("DSZERO_NO_NATIVE") != "1":
    ext_modules.append(
        Pybind11Extension(
            "dszero._cpu_adam",
            [os.path.join("csrc", "cpu_adam.cpp")],
            cxx_std=17,
            extra_compile_args=COMPILE_ARGS + OPENMP_ARGS,
            extra_link_args=list(OPENMP_ARGS),
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})

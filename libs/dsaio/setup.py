"""Builds dsaio's native core, and installs the package anyway when it cannot be built.

Everything declarative lives in pyproject.toml; this file exists only because an optional
C++ extension (one whose failure to compile is not an install failure) needs a build_ext hook.
At import, dsaio falls back to its pure-Python engine and says so once.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from pybind11.setup_helpers import Pybind11Extension
except ImportError:  # no pybind11 in the build env: install the pure-Python package only
    Pybind11Extension = None

SOURCES = ["drive.cpp", "linux_aio.cpp", "io_uring.cpp", "threads.cpp", "crc32.cpp", "module.cpp"]


class OptionalBuildExt(build_ext):
    """Turns a compile or link failure into a warning; DSAIO_REQUIRE_NATIVE=1 makes it fatal."""

    def run(self):
        try:
            super().run()
        except Exception as exc:
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    def _skip(self, exc):
        if os.environ.get("DSAIO_REQUIRE_NATIVE") == "1":
            raise exc
        print(f"dsaio: native core not built ({exc}); the pure-Python engine will be used", file=sys.stderr)


ext_modules = []
if Pybind11Extension is not None and sys.platform.startswith("linux") and os.environ.get("DSAIO_NO_NATIVE") != "1":
    ext_modules.append(
        Pybind11Extension(
            "dsaio._native",
            [os.path.join("csrc", s) for s in SOURCES],
            cxx_std=17,
            extra_compile_args=["-O2"],
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})

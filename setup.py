"""Builds the native kernels of the private ops (everything else is configured in pyproject.toml).

Optional: without a C++ compiler the project still installs and the custom-op library runs the numpy
reference kernels instead (``ivit_onnx.opset.native.available()`` tells which).
"""

import platform

from setuptools import Extension, setup

ARGS = ["-std=c++17", "-O3", "-fwrapv", "-pthread"]
if platform.machine() in ("x86_64", "AMD64", "aarch64", "arm64"):
    ARGS.append("-march=native")  # built where it runs (pip install); int64 vector multiplies on AVX-512

setup(ext_modules=[Extension("ivit_onnx.opset._kernels", sources=["opset/native/kernels.cpp"], language="c++",
                             extra_compile_args=ARGS, extra_link_args=["-pthread"], optional=True)])

"""Lists the packages from the source folders and builds the native kernels of the private ops and their
onnxruntime custom-op library (everything else is configured in pyproject.toml).

Packages: every folder with an ``__init__.py`` under the four roots of the layout (``ivit_onnx/``,
``passes/``, ``opset/``, ``models/``), so a new subpackage cannot be left out of a normal install.

Native code: one shared library, ``ivit_onnx/opset/_kernels*.so``, loaded with ctypes by
``ivit_onnx.opset.native_kernels`` and by onnxruntime through
``SessionOptions.register_custom_ops_library`` (it exports ``RegisterCustomOps``;
``opset/native/ort_ops.cpp``).

Optional: without a C++ compiler the project still installs and the private ops run on the numpy reference
kernels instead (``ivit_onnx.opset.native_kernels.available()`` tells which).

Instruction set: portable by default, so a wheel built on one machine runs on any other of its
architecture (x86-64: ``-march=x86-64-v2``, every x86-64 CPU since 2009; others: the compiler's default).
``IVIT_NATIVE_MARCH=native pip install ...`` tunes for the build machine instead (AVX-512 where it has it;
the result may die with an illegal instruction elsewhere), ``IVIT_NATIVE_MARCH=<arch>`` picks one
(``x86-64-v3``, ...), ``IVIT_NATIVE_MARCH=`` (empty) adds no ``-march`` at all.
"""

import os
import platform

from setuptools import Extension, find_packages, setup

#: installed package -> source folder (the design's top-level layout)
LAYOUT = {
    "ivit_onnx": "ivit_onnx",
    "ivit_onnx.passes": "passes",
    "ivit_onnx.opset": "opset",
    "ivit_onnx.models": "models",
}


def packages() -> list[str]:
    """Each root of the layout and every package below it."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        name
        for pkg, folder in LAYOUT.items()
        for name in [pkg, *(f"{pkg}.{sub}" for sub in find_packages(os.path.join(here, folder)))]
    ]


ARGS = ["-std=c++17", "-O3", "-fwrapv", "-pthread"]
MARCH = os.environ.get("IVIT_NATIVE_MARCH", "x86-64-v2" if platform.machine() in ("x86_64", "AMD64") else "")
if MARCH:
    ARGS.append(f"-march={MARCH}")
NATIVE = "opset/native/"

SOURCES = [NATIVE + f for f in ("kernels.cpp", "ort_ops.cpp", "gemm_check.cpp", "qgemm.cpp", "qgemm_op.cpp",
                                 "qbatch_op.cpp", "patch_op.cpp")]
HEADERS = [NATIVE + f for f in ("intmath.h", "kernels.h", "ort_abi.h", "parallel.h", "gemm_check.h",
                                "gemm_probe.h", "poly_exp.h", "qgemm.h", "ort_tensor.h", "ort_op.h")]

if __name__ == "__main__":  # setuptools runs this file as __main__; tests import packages() from it
    kernels = Extension(
        "ivit_onnx.opset._kernels",
        sources=SOURCES,
        depends=HEADERS,
        language="c++",
        extra_compile_args=ARGS,
        extra_link_args=["-pthread"],
        optional=True,
    )
    setup(packages=packages(), package_dir={k: v for k, v in LAYOUT.items() if k != v}, ext_modules=[kernels])

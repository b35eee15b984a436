"""The onnxruntime custom-op library of the private ops, and the sessions that use it.

The library is the project's own shared library (``opset/native/ort_ops.cpp`` with the compiled kernels of
``kernels.cpp``, built at install): onnxruntime loads it with ``register_custom_ops_library`` and calls
its ``RegisterCustomOps`` through onnxruntime's C ABI, which registers the ``ai.ivit`` ops in their own
domain, so a model runs as converted, with no Python in the loop. :func:`register` does that.

Fallback, only where that library was not built (no C++ compiler at install, or ``IVIT_NATIVE_LIB=``):
onnxruntime-extensions' prebuilt library hosting the numpy reference kernels as Python ops. It serves
only its own domain ``ai.onnx.contrib`` and fixes input/output types per registration, so each (op,
input dtypes) signature used by a model is registered once per process as ``Ivit<Op>__<dtypes>`` and
the model's ``ai.ivit`` nodes are renamed to it (:func:`library_model`). It is slow (the GIL, argument
conversion) but runs anywhere onnxruntime does.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from . import OPS, native_kernels
from ._spec import DOMAIN

CONTRIB = "ai.onnx.contrib"
#: session config entries of the native library's GEMM self-check (``native/gemm_check.cpp``): "1" before
#: registering when the model runs int8 x int8 GEMMs (the fallback); the outcome, read after registering
INT8_GEMMS = "ivit.int8_gemms"
CHECK = "ivit.gemm_check"
#: set by :func:`register`: the session is ivit-onnx's own, so the library gives no plain-route hint
SESSION = "ivit.session"
_registered: set[str] = set()
_hooked = False


def _invoke(k_id, feed, attributes):
    """onnxruntime-extensions' Python-op callback, handing numeric outputs back as arrays.

    The package's own callback returns every output as ``ndarray.tolist()``, which its C++ side turns
    back into an array: about 80 ns per element, far more than the kernels themselves. Its C++ side
    casts what it gets to ``py::array`` and copies it, so a flat contiguous array is taken as is.
    Strings keep the list form the C++ side needs for them.
    """
    from onnxruntime_extensions._ocos import Opdef

    op = Opdef._odlist.get(k_id)
    if op is None:
        raise RuntimeError(f"no Python op registered with id {k_id}")
    rv = op.body(*feed, **op.cast_attributes(attributes))
    res = []
    for r in rv if isinstance(rv, tuple) else (rv,):
        r = np.asarray(r)
        flat = r.reshape(-1).tolist() if r.dtype.kind in "OSU" else np.ascontiguousarray(r).reshape(-1)
        res += [r.shape, flat]
    return (k_id, *res)


def _install_hook() -> None:
    global _hooked
    if not _hooked:
        from onnxruntime_extensions import PyCustomOpDef

        PyCustomOpDef.install_hooker(_invoke)
        _hooked = True


def _pytype(dtype):
    from onnxruntime_extensions import PyCustomOpDef

    return getattr(PyCustomOpDef, f"dt_{np.dtype(dtype).name}")


def kernel_name(op: str, input_dtypes) -> str:
    return f"Ivit{op}__" + "_".join(np.dtype(d).name for d in input_dtypes)


def register_signature(op: str, input_dtypes) -> str:
    """Register the kernel of ``op`` for one input signature (idempotent); returns its op_type."""
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    _install_hook()
    name = kernel_name(op, input_dtypes)
    if name in _registered:
        return name
    spec = OPS[op]
    out = spec.output_dtype(list(input_dtypes))

    def kernel(*inputs, **attrs):
        return native_kernels.run(op, spec.reference, *inputs, **{k: int(v) for k, v in attrs.items()})

    onnx_op(op_type=name, inputs=[_pytype(d) for d in input_dtypes], outputs=[_pytype(out)],
            attrs={k: PyCustomOpDef.dt_int64 for k in spec.attributes})(kernel)
    _registered.add(name)
    return name


def _value_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {t.name: onnx.helper.tensor_dtype_to_np_dtype(t.data_type) for t in g.initializer}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.tensor_type.elem_type:
            types[v.name] = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = onnx.helper.tensor_dtype_to_np_dtype(a.t.data_type)
    return types


def library_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose ``ai.ivit`` nodes call the registered library kernels."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    types = _value_dtypes(model)
    for node in out.graph.node:
        if node.domain != DOMAIN:
            continue
        missing = [i for i in node.input if i not in types]
        if missing:
            raise ValueError(f"node {node.name or node.op_type}: no type known for inputs {missing}")
        node.op_type = register_signature(node.op_type, [types[i] for i in node.input])
        node.domain = CONTRIB
    keep = [f for f in out.functions if f.domain != DOMAIN]
    del out.functions[:]
    out.functions.extend(keep)
    imports = [i for i in out.opset_import if i.domain != DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(imports + [helper.make_opsetid(CONTRIB, 1)])
    return out


def native_library() -> str | None:
    """Path of the native custom-op library (the compiled kernels' shared library), if it was built."""
    path = native_kernels.library_path()
    return str(path) if path is not None else None


def register(opts: ort.SessionOptions, model: onnx.ModelProto) -> onnx.ModelProto:
    """Register the custom-op library with ``opts``; returns the model to load with them.

    The native library takes the model as it is; the onnxruntime-extensions fallback needs its
    renamed copy (:func:`library_model`, which registers the kernels: before the library is loaded).
    """
    path = native_library()
    if path is not None:
        opts.add_session_config_entry(SESSION, "1")
        opts.register_custom_ops_library(path)
        return model
    from onnxruntime_extensions import get_library_path

    model = library_model(model)
    opts.register_custom_ops_library(get_library_path())
    return model


def session(model: onnx.ModelProto, backend: str = "functions", threads: int | None = None):
    """An InferenceSession running the private ops by their ``functions`` or through the ``library``."""
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    if backend == "library":
        model = register(opts, model)
    elif backend == "functions":
        from ivit_onnx.int8_gemms import exact_int8_gemms
        from ivit_onnx.runners import exact_weight_gemms

        exact_weight_gemms(opts)
        model = exact_int8_gemms(model)
    else:
        raise ValueError(f"backend must be 'functions' or 'library', got {backend!r}")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

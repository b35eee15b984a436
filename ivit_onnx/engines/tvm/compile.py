"""Compile an integer ONNX model with TVM (llvm | cuda), export it as .so + JSON sidecar, load and run it."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from .cpu_gemm import pack_gemms, schedule_gemms
from .exact_quantize import LEGALIZE
from .int8_matmul import int8_matmul
from .prepare import prepare_for_tvm

FORMAT = "ivit-onnx-tvm/1"


@dataclass
class Artifact:
    """A compiled model: the executable (or loaded library), its I/O description and target."""

    module: object
    inputs: list[dict]
    outputs: list[dict]
    target: dict
    path: Path | None = None
    info: dict = field(default_factory=dict)
    _vm: object = field(default=None, repr=False, compare=False)

    def run(self, feeds: dict[str, np.ndarray] | list[np.ndarray]) -> list[np.ndarray]:
        """Run (llvm on the CPU, cuda on GPU 0); ``feeds`` by input name or in input order."""
        return run(self, feeds)


def make_target(target="llvm", arch: str | None = None) -> tvm.target.Target:
    """``"llvm"`` (host CPU, all cores), ``"cuda"`` (``arch`` e.g. ``"sm_90"``), a target dict or a Target."""
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str):
        if target == "llvm":
            target = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
                      "num-cores": _physical_cores()}
        elif target == "cuda":
            target = {"kind": "cuda", "arch": arch or "sm_80"}
        else:
            return tvm.target.Target(target)
    target = dict(target)
    if arch is not None and target.get("kind") == "cuda":
        target["arch"] = arch
    return tvm.target.Target(target)


def _physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def _np_dtype(elem_type: int) -> str:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name


def io_specs(model: onnx.ModelProto, shape: dict | None = None) -> tuple[list[dict], list[dict]]:
    """Graph inputs (not initializers) and outputs as ``{name, shape, dtype}``; inputs must be static."""
    shape = shape or {}
    inits = {i.name for i in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        dims = list(shape.get(vi.name, dims))
        if any(d is None or d <= 0 for d in dims):
            raise ValueError(f"input {vi.name!r} has a dynamic shape {dims}: "
                             f"pass shape={{{vi.name!r}: [...]}}")
        dtype = _np_dtype(vi.type.tensor_type.elem_type)
        inputs.append({"name": vi.name, "shape": [int(d) for d in dims], "dtype": dtype})
    outputs = [{"name": vo.name, "dtype": _np_dtype(vo.type.tensor_type.elem_type)}
               for vo in model.graph.output]
    return inputs, outputs


def import_relax(model: onnx.ModelProto, inputs: list[dict], int8: bool = True,
                 mixed_sign: bool = False) -> tuple[tvm.IRModule, int]:
    """Prepared ONNX -> Relax (weights as constants); with ``int8``, MatMulInteger operands stay 8-bit.
    ``ai.ivit`` nodes left by ``prepare_for_tvm(keep_ops=...)`` become the TIR kernels of :mod:`.kernels`;
    ``mixed_sign``: the target multiplies uint8 x int8 natively (llvm's VNNI), so P·V keeps V int8."""
    from .kernels import ivit_converters

    with ivit_converters(mixed_sign):
        mod = from_onnx(model, shape_dict={i["name"]: i["shape"] for i in inputs},
                        dtype_dict={i["name"]: i["dtype"] for i in inputs}, keep_params_in_input=False)
    # converters that take a producer into their kernel (kernels.frontend._Import) leave it unused
    mod = relax.transform.DeadCodeElimination()(mod)
    return int8_matmul(mod) if int8 else (mod, 0)


def _backend(target: tvm.target.Target):
    # the backends' own pipeline modules: relax.pipeline.dataflow_lower_passes(llvm) fails in 0.27
    # (cpu_generic does not export dataflow_lower_passes)
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline
    else:
        from tvm.relax.backend.cpu_generic import pipeline
    return pipeline


def fuse(mod: tvm.IRModule, target: tvm.target.Target, prologue: bool | None = None) -> tvm.IRModule:
    """Legalize and fuse into TIR functions: the module meta-schedule extracts its tuning tasks from.
    ``prologue``: GEMMs take their injective producers (:mod:`.prologue`; default: on cuda only, where the
    tensor-core schedule computes them in its operand loads)."""
    from .kernels import restore_injective, schedule_row_kernels

    passes = _backend(target).library_dispatch_passes(target) + [
        relax.transform.LegalizeOps(LEGALIZE), relax.transform.AnnotateTIROpPattern(), restore_injective,
        relax.transform.FoldConstant(), relax.transform.FuseOps()]
    if target.kind.name == "cuda" if prologue is None else prologue:
        from .prologue import fuse_prologue

        passes.append(fuse_prologue)
    passes.append(relax.transform.FuseTIR())

    with target:
        return schedule_row_kernels(tvm.transform.Sequential(passes)(mod), target)


def relax_pipeline(target: tvm.target.Target, database=None, chains: bool = True) -> tvm.transform.Pass:
    """After :func:`fuse`: schedules from ``database``, on cuda the int8 tensor-core rules, then lowering."""
    backend = _backend(target)

    @tvm.transform.module_pass(opt_level=0, name="IvitTVMPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        passes = []
        if database is not None:
            passes.append(relax.transform.MetaScheduleApplyDatabase())
        if target.kind.name == "cuda":
            from .cuda import gpu_schedules

            passes.append(gpu_schedules())
        elif target.kind.name == "llvm" and chains:
            from .chains import cpu_schedules

            passes.append(cpu_schedules())
        passes += backend.dataflow_lower_passes(target) + backend.finalize_passes(target)
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def compile_model(model_or_path, target="llvm", arch: str | None = None, out=None, tune_trials: int = 0,
                  tune_db=None, shape: dict | None = None, int8: bool = True,
                  fast_math: bool = False, progress=None, kernels: bool = True,
                  cuda_graph: bool = False) -> Artifact:
    """Compile an (integer) ONNX model for ``target``; with ``out`` (a ``.so`` path) export it + ``.json``.

    On cuda, CUDA source is compiled with IEEE float flags (:func:`.cuda.exact_cuda_compile`) unless
    ``fast_math`` (TVM's default ``--use_fast_math``, e.g. for an FP32 baseline). ``cuda_graph``: capture
    the static parts of the forward as CUDA graphs (``relax.backend.use_cuda_graph``).

    ``tune_trials > 0`` runs meta-schedule tuning into the database directory ``tune_db`` (a temporary one if
    None) first; an existing ``tune_db`` with ``tune_trials == 0`` only applies the schedules stored there.
    ``progress``: called with the name of each stage as it starts (the CLI prints them).
    ``kernels``: the private ops as the fused TIR kernels of :mod:`.kernels` (else their inlined bodies).
    """
    say = progress or (lambda _stage: None)
    say("preparing the graph")
    model = onnx.load(str(model_or_path)) if isinstance(model_or_path, str | os.PathLike) else model_or_path
    from .kernels import KERNEL_OPS

    inputs, outputs = io_specs(model, shape)
    prepared = prepare_for_tvm(model, keep_ops=KERNEL_OPS if kernels else (),
                               shapes={i["name"]: i["shape"] for i in inputs})
    say("importing into Relax")
    tgt = make_target(target, arch)
    mod, n_int8 = import_relax(prepared, inputs, int8, mixed_sign=tgt.kind.name == "llvm")
    mod = schedule_gemms(fuse(pack_gemms(mod, tgt)[0], tgt), tgt)  # llvm only: cpu_gemm.py
    database = None
    if tune_trials > 0 or tune_db is not None:
        from .tune import open_database, tune

        say(f"tuning ({tune_trials} trials)" if tune_trials > 0 else "opening the tuning database")
        database = tune(mod, tgt, tune_trials, tune_db) if tune_trials > 0 else open_database(tune_db)
    say(f"building for {tgt.kind.name} (tvm.compile)")
    config = {"relax.backend.use_cuda_graph": True} if cuda_graph else {}
    with tvm.transform.PassContext(opt_level=3, config=config), _cuda_flags(tgt, fast_math):
        if database is not None:
            with database:
                executable = tvm.compile(mod, target=tgt, relax_pipeline=relax_pipeline(tgt, database))
        else:
            executable = tvm.compile(mod, target=tgt, relax_pipeline=relax_pipeline(tgt))
    target_dict = {k: (v if isinstance(v, int | str) else str(v)) for k, v in tgt.attrs.items()}
    target_dict["kind"] = tgt.kind.name
    info = {"format": FORMAT, "tvm": tvm.__version__, "int8_matmuls": n_int8, "tune_trials": tune_trials,
            "tune_db": str(tune_db) if tune_db else None, "fast_math": bool(fast_math),
            "kernels": bool(kernels), "cuda_graph": bool(cuda_graph)}
    art = Artifact(executable, inputs, outputs, target_dict, None, info)
    if out is not None:
        export(art, out)
    return art


def _cuda_flags(target: tvm.target.Target, fast_math: bool):
    """The exact CUDA compile callback for cuda targets (unless ``fast_math``), else nothing."""
    if target.kind.name != "cuda" or fast_math:
        return contextlib.nullcontext()
    from .cuda import exact_cuda_compile

    return exact_cuda_compile()


def export(art: Artifact, path) -> Path:
    """Write the library to ``path`` (``.so``) and the sidecar next to it (``.json``); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    art.module.export_library(str(path))
    sidecar = {**art.info, "library": path.name, "target": art.target, "inputs": art.inputs,
               "outputs": art.outputs}
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    art.path = path
    return path


def load(path) -> Artifact:
    """Load an exported artifact from its ``.so`` or its ``.json`` sidecar."""
    path = Path(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} sidecar")
    lib = path.with_name(meta["library"])
    module = tvm.runtime.load_module(str(lib))
    info = {k: v for k, v in meta.items() if k not in ("library", "target", "inputs", "outputs")}
    return Artifact(module, meta["inputs"], meta["outputs"], meta["target"], lib, info)


def device_for(art: Artifact):
    """The device an artifact runs on: the CPU for llvm, GPU 0 for cuda."""
    kind = art.target.get("kind")
    if kind == "llvm":
        return tvm.cpu()
    if kind == "cuda":
        dev = tvm.cuda(0)
        if not dev.exist:
            raise RuntimeError("this artifact targets cuda and no CUDA device is visible")
        return dev
    raise ValueError(f"no runner for target kind {kind!r}")


def run(art: Artifact, feeds) -> list[np.ndarray]:
    """Run an artifact: ``feeds`` by input name (dict) or in input order (list); numpy outputs in order."""
    dev = device_for(art)
    if art._vm is None:
        art._vm = relax.VirtualMachine(art.module, dev)
    if isinstance(feeds, dict):
        missing = [i["name"] for i in art.inputs if i["name"] not in feeds]
        if missing:
            raise KeyError(f"missing inputs {missing}")
        feeds = [feeds[i["name"]] for i in art.inputs]
    args = []
    for spec, value in zip(art.inputs, feeds, strict=True):
        arr = np.asarray(value)
        arr = arr if arr.flags.c_contiguous else arr.copy()  # (ascontiguousarray makes 0-d arrays 1-d)
        if arr.dtype != np.dtype(spec["dtype"]) or list(arr.shape) != spec["shape"]:
            raise ValueError(f"input {spec['name']}: expected {spec['dtype']}{spec['shape']}, "
                             f"got {arr.dtype}{list(arr.shape)}")
        args.append(tvm.runtime.tensor(arr, dev))
    result = art._vm["main"](*args)
    items = [result] if hasattr(result, "numpy") else list(result)
    return [r.numpy() for r in items]

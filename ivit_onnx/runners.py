"""Backends behind one interface: run a model on feeds, optionally exposing intermediate tensors.

* ``library``   -- onnxruntime with the custom-op library (the private ops' compiled kernels, C ABI);
* ``functions`` -- stock onnxruntime running the private ops' ONNX function bodies;
* ``reference`` -- ``onnx.reference`` with the private ops bound to the numpy reference kernels;
* ``onnxruntime`` -- plain onnxruntime, for the fake-quant and FP32 reference models.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import helper

INT_BACKENDS = ("library", "functions", "interpreter")
#: former backend names still accepted (#13: "reference" meant four things; this backend is the interpreter)
BACKEND_ALIASES = {"reference": "interpreter"}


def node_outputs(model: onnx.ModelProto) -> list[str]:
    """Every main-graph node output, in the graph's (topological) order."""
    return [o for n in model.graph.node for o in n.output if o]


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output if o}


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers (what a caller has to feed)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs are its own followed by ``names`` (node outputs only)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    made = set(node_outputs(out))
    for n in names:
        if n not in have and n in made:
            out.graph.output.append(helper.make_empty_tensor_value_info(n))
            have.add(n)
    return out


def simulate_qdq(opts) -> None:
    """Run a fake-quant model as it defines itself: its Q/DQ in float, not fused into onnxruntime's int8
    kernels (whose uint8 x int8 GEMMs saturate on x86 CPUs without VNNI, and round differently)."""
    opts.add_session_config_entry("session.disable_quant_qdq", "1")


def exact_weight_gemms(opts) -> None:
    """A converted model's own uint8 x int8 weight GEMMs (from uint8-activation quantizers) on onnxruntime's
    exact kernels where its uint8 x int8 one saturates (x86 without VNNI; elsewhere this changes nothing)."""
    opts.add_session_config_entry("session.x64quantprecision", "1")


class Runner:
    """One backend for one model: ``run(feeds)`` gives the graph outputs, ``run_with`` intermediates too."""

    name = "runner"

    def __init__(self, model: onnx.ModelProto, threads: int | None = None):
        self.model = model
        self.threads = threads
        self.output_names = [o.name for o in model.graph.output]
        self.input_names = [i.name for i in graph_inputs(model)]
        self.seconds = 0.0  # time spent in run()
        self.samples = 0

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = time.perf_counter()
        out = self._run(feeds, [])
        self.seconds += time.perf_counter() - t
        self.samples += len(next(iter(feeds.values()))) if feeds else 0
        return out

    def run_with(self, feeds: dict[str, np.ndarray], tensors: list[str]) -> dict[str, np.ndarray]:
        """Graph outputs plus the requested tensors (those that exist: node outputs and graph inputs)."""
        out = self._run(feeds, list(tensors))
        out.update({k: v for k, v in feeds.items() if k in tensors})
        return out

    def _run(self, feeds, extra: list[str]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def describe(self) -> str:
        """How this backend runs the model, when there is more to say than its name."""
        return ""


class OrtRunner(Runner):
    """onnxruntime on the CPU; ``backend`` is ``library`` (the onnxruntime engine's session: the custom-op
    library on the compiled model, :mod:`ivit_onnx.engines.onnxruntime`), ``functions`` (stock onnxruntime on
    the function bodies) or ``onnxruntime`` (plain, for the fake-quant and FP32 reference models)."""

    def __init__(self, model: onnx.ModelProto, backend: str = "onnxruntime", threads: int | None = None,
                 u8_gemm: bool | None = None, bias_fold: bool = True, patch_gemm: bool = True,
                 chain_fold: bool = True):
        super().__init__(model, threads)
        if backend not in ("library", "functions", "onnxruntime"):
            raise ValueError(f"unknown onnxruntime backend {backend!r}")
        self.name = backend
        self._sessions: dict[tuple, object] = {}
        #: the engine's compile step (library only): the uint8 re-encoding is on unless asked off
        self.rewrites = {"u8_gemm": u8_gemm is not False, "bias_fold": bias_fold, "patch": patch_gemm,
                         "chain_fold": chain_fold}

    @property
    def engine(self):
        """The library backend's main engine session (built on first use)."""
        return self._session(())

    def session_model(self) -> onnx.ModelProto:
        """The model the library backend's session runs (the compiled artifact); the others' as given."""
        return self.engine.compiled.model if self.name == "library" else self.model

    def _session(self, extra: tuple[str, ...]):
        if extra not in self._sessions:
            import onnxruntime as ort

            if self.name == "library":
                from ivit_onnx.engines import ENGINES

                engine = ENGINES["onnxruntime"]
                self._sessions[extra] = engine.session(self.model, self.threads, keep=extra, **self.rewrites)
            else:
                from ivit_onnx.engines.onnxruntime.session import session_options

                opts = session_options(self.threads)
                if self.name == "onnxruntime":
                    simulate_qdq(opts)
                else:
                    exact_weight_gemms(opts)
                model = with_outputs(self.model, list(extra)) if extra else self.model
                if self.name == "functions":
                    from ivit_onnx.int8_gemms import exact_int8_gemms

                    model = exact_int8_gemms(model)
                self._sessions[extra] = ort.InferenceSession(model.SerializeToString(), opts,
                                                             providers=["CPUExecutionProvider"])
        return self._sessions[extra]

    def prepare(self) -> None:
        """Build the main session now (so that its cost is not timed as inference)."""
        self._session(())

    def describe(self) -> str:
        if self.name == "functions":
            from ivit_onnx.int8_gemms import wraps

            return (f"int8 x int8 GEMMs run as uint8 (exact), as onnxruntime's wraps here: {wraps()}"
                    if wraps() else "")
        return self.engine.describe() if self.name == "library" else ""

    def _run(self, feeds, extra):
        from ivit_onnx.engines.onnxruntime.u8_gemm import decode

        made = set(node_outputs(self.model))
        extra = tuple(t for t in extra if t in made and t not in self.output_names)
        sess = self._session(extra)
        recoded = sess.compiled.recoded if self.name == "library" else set()
        names = [o.name for o in sess.get_outputs()]
        return {k: decode(k, v, recoded) for k, v in zip(names, sess.run(names, feeds), strict=True)}


class ReferenceRunner(Runner):
    """The interpreter backend: ``onnx.reference`` with the private ops on their numpy reference kernels
    (slow; exact)."""

    name = "interpreter"

    def __init__(self, model: onnx.ModelProto, threads: int | None = None):
        super().__init__(model, threads)
        from ivit_onnx.opset.reference import evaluator

        self._eval = evaluator(model)

    def prepare(self) -> None:
        pass

    def _run(self, feeds, extra):
        if not extra:
            return dict(zip(self.output_names, self._eval.run(None, feeds), strict=True))
        every = self._eval.run(None, feeds, intermediate=True)
        want = set(self.output_names) | set(extra)
        return {k: np.asarray(v) for k, v in every.items() if k in want}


def make_runner(backend: str, model: onnx.ModelProto, threads: int | None = None,
                u8_gemm: bool | None = None) -> Runner:
    """The runner for ``backend``: one of :data:`INT_BACKENDS` (or an alias) or ``onnxruntime``."""
    if BACKEND_ALIASES.get(backend, backend) == "interpreter":
        runner = ReferenceRunner(model, threads)
        runner.name = backend  # reported as the caller spelled it
        return runner
    return OrtRunner(model, backend, threads, u8_gemm)

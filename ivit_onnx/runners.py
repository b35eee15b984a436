"""Backends behind one interface: run a model on feeds, optionally exposing intermediate tensors.

* ``library``   -- onnxruntime with the custom-op library (the private ops' compiled kernels, C ABI);
* ``functions`` -- stock onnxruntime running the private ops' ONNX function bodies;
* ``reference`` -- ``onnx.reference`` with the private ops bound to the numpy reference kernels;
* ``onnxruntime`` -- plain onnxruntime, for the fake-quant and FP32 reference models.
"""

from __future__ import annotations

import sys
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


class _Retry(Exception):
    """The library refused the uint8 GEMM forms: build the session again without them."""


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
    """onnxruntime on the CPU; ``backend`` is ``library``, ``functions`` or ``onnxruntime`` (plain)."""

    def __init__(self, model: onnx.ModelProto, backend: str = "onnxruntime", threads: int | None = None,
                 u8_gemm: bool | None = None, bias_fold: bool = True, patch_gemm: bool = True,
                 chain_fold: bool = True):
        super().__init__(model, threads)
        if backend not in ("library", "functions", "onnxruntime"):
            raise ValueError(f"unknown onnxruntime backend {backend!r}")
        self.name = backend
        self._sessions: dict[tuple, object] = {}
        #: re-encode int8 GEMM operands as uint8 (exact; :mod:`ivit_onnx.u8_gemm`), default: the native
        #: library only (its self-check proves them exact on this CPU; the extensions fallback has none)
        from ivit_onnx.opset import native_kernels

        self.u8_gemm = backend == "library" and native_kernels.available() if u8_gemm is None else u8_gemm
        self.gemm_check = ""  # the library's self-check outcome (its session config entry ivit.gemm_check)
        self.recoded: set[str] = set()  # tensors the session holds re-encoded (decoded on the way out)
        self.recoded_producers: list[str] = []
        self.bias_fold = bias_fold  # library: fold GEMM bias Adds into Requantize (ivit_onnx.bias_fold)
        self.bias_folds = 0  # how many it folded
        self.patch_gemm = patch_gemm  # library: patch ConvInteger as MatMulInteger (ivit_onnx.patch_gemm)
        self.patch_gemms = 0  # how many it rewrote
        self.chain_fold = chain_fold  # library: Requantize + elementwise ops as one lookup (chain_fold)
        self.chain_folds = 0  # how many it folded
        self._run_model = None

    def session_model(self, extra: tuple[str, ...] = ()) -> onnx.ModelProto:
        """The model this runner's session loads: the library backend's session-time rewrites applied to it
        where the native library runs it (``extra``: intermediates that must survive them)."""
        model = self._prepared()
        from ivit_onnx.opset import native_kernels

        if self.name != "library" or not native_kernels.available():
            return model
        if self.bias_fold:
            from ivit_onnx.bias_fold import fold_bias

            model, self.bias_folds = fold_bias(model, keep=set(extra))
        if self.chain_fold:
            from ivit_onnx.chain_fold import fold_chains

            model, self.chain_folds = fold_chains(model, keep=set(extra))
        return model

    def _options(self):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # validate runs several sessions in turn: idle workers spinning after a run would steal the
        # cores of the next session (measured: FP32 DeiT-Tiny 105 ms with spinning, 68 ms without)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self.name == "onnxruntime":
            simulate_qdq(opts)
        elif self.name == "functions":
            exact_weight_gemms(opts)
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        return opts

    def _register(self, opts, model: onnx.ModelProto) -> onnx.ModelProto:
        """Register the library, whose GEMM self-check may refuse the uint8 forms on this CPU: then warn once
        and fall back to the int8 GEMMs as converted (exact, slower)."""
        from ivit_onnx.opset import native_kernels, ort_library

        native_kernels.set_threads(self.threads)  # the fallback's kernels (the library: ORT's pool)
        if not self.u8_gemm:
            opts.add_session_config_entry(ort_library.INT8_GEMMS, "1")
        try:
            model = ort_library.register(opts, model)
        except Exception as e:  # onnxruntime's Fail: the self-check's one line
            if not self.u8_gemm or ort_library.INT8_GEMMS not in str(e):
                raise
            from ivit_onnx import cpu

            print(f"ivit-onnx: warning: onnxruntime's uint8 GEMMs are not exact on {cpu.describe()}; running "
                  "the int8 GEMMs as converted (exact, slower)", file=sys.stderr)
            self.u8_gemm, self._run_model, self.recoded, self.recoded_producers = False, None, set(), []
            self._sessions.clear()
            raise _Retry() from e
        if ort_library.native_library():
            self.gemm_check = opts.get_session_config_entry(ort_library.CHECK)
        return model

    def _session(self, extra: tuple[str, ...]):
        if extra not in self._sessions:
            import onnxruntime as ort

            for _ in range(2):
                opts, model = self._options(), self.session_model(extra)
                try:
                    if self.name == "library":
                        model = self._register(opts, model)
                    break
                except _Retry:
                    continue
            if extra:
                model = with_outputs(model, list(extra))
            self._sessions[extra] = ort.InferenceSession(model.SerializeToString(), opts,
                                                         providers=["CPUExecutionProvider"])
        return self._sessions[extra]

    def _prepared(self) -> onnx.ModelProto:
        if self._run_model is None:
            self._run_model = self.model
            if self.name == "library" and self.patch_gemm:  # before the re-encoding: its GEMM takes uint8 A
                from ivit_onnx.patch_gemm import patch_gemm

                self._run_model, self.patch_gemms = patch_gemm(self.model)
            if self.u8_gemm:
                from ivit_onnx.u8_gemm import recode

                done = recode(self._run_model)
                self._run_model, self.recoded = done.model, done.tensors
                self.recoded_producers = done.producers
        return self._run_model

    def prepare(self) -> None:
        """Build the main session now (so that its cost is not timed as inference)."""
        self._session(())

    def describe(self) -> str:
        if self.name != "library":
            return ""
        from ivit_onnx.opset import native_kernels

        kernels = ("native custom-op library (compiled kernels, C ABI)" if native_kernels.available() else
                   "numpy reference kernels in onnxruntime-extensions (the native library was not built)")
        gemm = (f"{len(self.recoded_producers)} int8 GEMM operand producers re-encoded as uint8 (exact)"
                if self.u8_gemm else "int8 GEMMs as converted")
        gemm += f"; GEMM self-check: {self.gemm_check}" if self.gemm_check else ""
        folds = f"; {self.bias_folds} GEMM bias Adds folded into Requantize" if self.bias_folds else ""
        folds += f"; {self.patch_gemms} patch ConvInteger as MatMulInteger" if self.patch_gemms else ""
        folds += f"; {self.chain_folds} Requantize chains as table lookups" if self.chain_folds else ""
        return f"{kernels}; {gemm}{folds}"

    def _run(self, feeds, extra):
        from ivit_onnx.u8_gemm import decode

        made = set(node_outputs(self.model))
        extra = tuple(t for t in extra if t in made and t not in self.output_names)
        sess = self._session(extra)
        names = [o.name for o in sess.get_outputs()]
        return {k: decode(k, v, self.recoded) for k, v in zip(names, sess.run(names, feeds), strict=True)}


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

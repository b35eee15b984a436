"""The onnxruntime engine's compile step: the library's exact rewrites applied once to ``int.onnx``, saved
as an artifact that a plain onnxruntime session with the library registered runs at full speed, on every
CPU.

The artifact's 8-bit GEMMs are the forms the library's self-check proves at registration (uint8 x constant
int8, uint8 x uint8; every ConvInteger uint8 x constant uint8; ``opset/gemm_probe.py``), or int8 x int8 as
converted (``u8_gemm=False``: the fallback,
marked so that the session registers the library for it). Graph outputs are never re-encoded, so the artifact
computes the same output bits as ``int.onnx``. The metadata key ``ivit.engine`` marks an artifact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import onnx

from ivit_onnx.weights import unshare_gemm_weights

from .attn_fold import fold_attention
from .bias_fold import fold_bias
from .chain_fold import fold_chains
from .head_views import head_views, static_shapes
from .patch_gemm import patch_gemm
from .patch_layout import patch_layout
from .patch_quantize import quantize_patches
from .qgemm_fold import fast_path, fold_qgemm
from .resid_fold import POST, SECOND, fold_residuals
from .u8_gemm import own_uint8_weights, recode, uint8_copies

ENGINE_KEY = "ivit.engine"
#: metadata: "uint8" or "int8", the GEMM forms the artifact runs (the session registers the library for them)
GEMMS_KEY = "ivit.gemms"
#: metadata: what each rewrite did (JSON), so a loaded artifact describes itself
COUNTS_KEY = "ivit.compile"


@dataclass
class Compiled:
    """The artifact, the tensors it holds as ``int8 + 128`` in uint8 (intermediates only) and what each
    rewrite did."""

    model: onnx.ModelProto
    recoded: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, model: onnx.ModelProto) -> Compiled:
        """A saved artifact, with the counts its compile step recorded."""
        return cls(model, counts=json.loads(_meta(model).get(COUNTS_KEY, "{}")))

    @property
    def uint8_gemms(self) -> bool:
        return _meta(self.model).get(GEMMS_KEY) == "uint8"

    def describe(self) -> str:
        """One line of what the compile step did, for reports."""
        c = self.counts
        gemm = (f"{c.get('u8_gemm', 0)} int8 GEMM operand producers re-encoded as uint8 (exact)"
                if self.uint8_gemms else "int8 GEMMs as converted")
        done = [gemm]
        done += [f"{c['u8_conv']} ConvInteger as uint8 x uint8"] if c.get("u8_conv") else []
        done += [f"{c['u8_copy']} int8 MatMulInteger operands as uint8 copies"] if c.get("u8_copy") else []
        done += [f"{c['u8_weights']} uint8-activation GEMMs with -128 weights on uint8 weights"] if c.get(
            "u8_weights") else []
        done += [f"{c['bias_fold']} GEMM bias Adds folded into Requantize"] if c.get("bias_fold") else []
        done += [f"{c['patch_gemm']} patch ConvInteger as MatMulInteger"] if c.get("patch_gemm") else []
        done += [f"{c['patch_layout']} patch embeddings' per-channel ops on the GEMM's tokens (no transposes)"
                 ] if c.get("patch_layout") else []
        done += [f"{c['chain_fold']} Requantize chains as table lookups"] if c.get("chain_fold") else []
        done += [f"{c['qgemm']} GEMM + Requantize pairs as the library's QGemm"] if c.get("qgemm") else []
        done += [f"{c['resid_fold']} IAdds in the QGemm epilogue"] if c.get("resid_fold") else []
        done += [f"{c['second_add']} second IAdds (after a bias IAdd) in the same epilogue"] if c.get(
            "second_add") else []
        done += [f"{c['post_table']} tabulated chains after those IAdds in the same epilogue"] if c.get(
            "post_table") else []
        done += [f"{c['qbatch']} activation GEMMs (attention) as the library's QBatchMatMul"] if c.get(
            "qbatch") else []
        done += [f"{c['head_views']} attention head splits and merges read in place"] if c.get(
            "head_views") else []
        done += [f"{c['patch_quantize']} patch embedding input quantizes and im2cols as one pass"] if c.get(
            "patch_quantize") else []
        return "; ".join(done)


def _drop_unused_initializers(g: onnx.GraphProto) -> None:
    """The rewrites leave constants nothing reads (onnxruntime warns about each one at load)."""
    used = {i for n in g.node for i in n.input} | {i.name for i in g.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def is_artifact(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is this engine's compiled artifact (not a model as converted)."""
    return _meta(model).get(ENGINE_KEY) == "onnxruntime"


def compile_model(model: onnx.ModelProto, *, u8_gemm: bool = True, bias_fold: bool = True, patch: bool = True,
                  chain_fold: bool = True, qgemm: bool = True, qbatch: bool = True, resid: bool = True,
                  keep=frozenset()) -> Compiled:
    """Apply the rewrites to a copy of ``model`` (an integer model as converted); ``keep`` names intermediates
    that must survive them (validate's per-layer comparison). ``chain_fold`` writes ops that only the native
    library has."""
    if is_artifact(model):
        raise ValueError("the model is already compiled for onnxruntime")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    counts: dict[str, int] = {}
    recoded: set[str] = set()
    if patch:
        out, counts["patch_gemm"] = patch_gemm(out)
        out, counts["patch_layout"] = patch_layout(out, keep=set(keep))
    if u8_gemm:
        done = recode(out)
        out, recoded, counts["u8_gemm"] = done.model, done.tensors, len(done.producers)
        if done.convs:
            counts["u8_conv"] = done.convs
    if bias_fold:
        out, counts["bias_fold"] = fold_bias(out, keep=set(keep))
    if chain_fold:
        out, counts["chain_fold"] = fold_chains(out, keep=set(keep))
    if qgemm and fast_path():
        out, counts["qgemm"] = fold_qgemm(out, keep=set(keep))
        if resid:
            out, counts["resid_fold"] = fold_residuals(out, keep=set(keep))
            ops = [n.op_type for n in out.graph.node]
            counts["post_table"] = sum(op in POST.values() for op in ops)
            counts["second_add"] = sum(op.removesuffix("Table") in SECOND.values() for op in ops)
        if qbatch:
            out, counts["qbatch"] = fold_attention(out, keep=set(keep))
            out, counts["head_views"] = head_views(out, keep=set(keep), shapes=static_shapes(model))
        if patch:
            out, counts["patch_quantize"] = quantize_patches(out, keep=set(keep))
    if u8_gemm and (copies := uint8_copies(out, model, recoded)):
        counts["u8_copy"] = copies  # int8 operands nothing could re-encode, where QGemm did not fuse
    if u8_gemm and (moved := own_uint8_weights(out, model)):
        counts["u8_weights"] = moved  # a uint8 quantizer's GEMMs with -128 weights, where QGemm did not fuse
    counts["unshared_weights"] = unshare_gemm_weights(out)
    _drop_unused_initializers(out.graph)
    meta = {**_meta(out), ENGINE_KEY: "onnxruntime", GEMMS_KEY: "uint8" if u8_gemm else "int8",
            COUNTS_KEY: json.dumps(counts, sort_keys=True)}
    del out.metadata_props[:]
    for k, v in meta.items():
        out.metadata_props.add(key=k, value=v)
    return Compiled(out, recoded, counts)


def gemm_forms(model: onnx.ModelProto) -> str:
    """The GEMM forms an artifact was compiled for ("uint8" or "int8"); a converted model runs int8."""
    return _meta(model).get(GEMMS_KEY, "int8")


__all__ = ["Compiled", "compile_model", "gemm_forms", "is_artifact"]

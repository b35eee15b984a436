"""Fuse a patch embedding's input ``QuantizeLinear -> Reshape -> Transpose(0, 2, 4, 1, 3, 5) -> Reshape`` (the
im2col :mod:`.patch_gemm` writes) into the native library's ``ai.ivit.engine`` QuantizePatches
(``opset/native/patch_op.cpp``).

onnxruntime quantizes the image into a uint8 tensor, then transposes it on one thread (DeiT-Tiny at batch 8:
0.45 ms of a 35 ms forward). QuantizePatches quantizes each image row once and writes it straight into its
patches' rows, on onnxruntime's pool, with onnxruntime's QuantizeLinear arithmetic (IEEE division, clip,
rounding half to even), so the artifact keeps the bits of ``int.onnx``. Fused: a float image that is a
graph input of static ``[N, C, H, W]``, a constant scalar scale and int8/uint8 zero point, the two Reshapes'
constant targets ``[0, C, H/ph, ph, W/pw, pw]`` and ``[0, (H/ph) * (W/pw), C * ph * pw]``, and intermediates
that nothing else reads (graph outputs and ``keep`` stay) but Shape nodes of the quantized image, which then
read the float image (the same shape).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ivit_onnx.graph import node_attrs

from .qgemm_fold import ENGINE_DOMAIN, _Graph, apply

IM2COL = [0, 2, 4, 1, 3, 5]


def _image_shapes(g: onnx.GraphProto) -> dict[str, list[int]]:
    """Graph inputs that are float ``[N, C, H, W]`` with static C, H, W: name -> [C, H, W]."""
    shapes = {}
    for vi in g.input:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if t.elem_type == TensorProto.FLOAT and len(dims) == 4 and all(dims[1:]):
            shapes[vi.name] = dims[1:]
    return shapes


def _scalar(consts: dict, name: str, kinds: str) -> np.ndarray | None:
    v = consts.get(name)
    return v if v is not None and v.size == 1 and v.dtype.kind in kinds else None


def quantize_patches(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with each eligible patch quantize and im2col as one QuantizePatches; returns it and
    how many were fused."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    gr, images = _Graph(out.graph, keep), _image_shapes(out.graph)

    def only(tensor: str, op: str, shapes: bool = False) -> onnx.NodeProto | None:
        """The one ``op`` reading ``tensor`` (besides, with ``shapes``, Shape nodes), else None."""
        found = [(n, k) for n, k in gr.uses.get(tensor, []) if not (shapes and n.op_type == "Shape")]
        if tensor in gr.protected or len(found) != 1:
            return None
        node, k = found[0]
        return node if node.op_type == op and node.domain in ("", "ai.onnx") and k == 0 else None

    def target(node: onnx.NodeProto) -> list[int] | None:
        v = gr.const(node, 1)
        if v is None or node_attrs(node).get("allowzero", 0):
            return None
        return [int(d) for d in v.reshape(-1)]

    replace, dead = {}, set()  # each QuantizePatches in place of its last Reshape (by id); the nodes that go
    for q in out.graph.node:
        if q.op_type != "QuantizeLinear" or q.domain not in ("", "ai.onnx") or len(q.input) != 3:
            continue
        chw = images.get(q.input[0])
        scale, zp = _scalar(gr.consts, q.input[1], "f"), _scalar(gr.consts, q.input[2], "iu")
        if chw is None or scale is None or scale.dtype != np.float32 or zp is None or zp.dtype.itemsize != 1:
            continue
        first = only(q.output[0], "Reshape", shapes=True)
        perm = first and only(first.output[0], "Transpose")
        second = perm and only(perm.output[0], "Reshape")
        if not second or node_attrs(perm).get("perm") != IM2COL:
            continue
        t1, t2 = target(first), target(second)
        c, h, w = chw
        if t1 is None or t2 is None or len(t1) != 6 or t1[0] != 0 or t1[1] != c:
            continue
        _, _, ho, ph, wo, pw = t1
        if min(ho, ph, wo, pw) < 1 or ho * ph != h or wo * pw != w or t2 != [0, ho * wo, c * ph * pw]:
            continue
        replace[id(second)] = helper.make_node(
            "QuantizePatches", list(q.input), [second.output[0]], name=f"{q.name or q.output[0]}/patches",
            domain=ENGINE_DOMAIN, patch_h=ph, patch_w=pw)
        dead.update(id(n) for n in (q, first, perm))
        for n, _ in gr.uses.get(q.output[0], []):  # a Shape of the quantized image: the image's own
            if n.op_type == "Shape":
                n.input[0] = q.input[0]
    return out, apply(out, replace, dead)


__all__ = ["quantize_patches"]

"""fix_random: random numbers read only for their order (a shuffle) become one fixed draw, if the outputs
do not depend on it.

ViTMAE's embeddings draw uniform noise and sort it (``argsort``: TopK's indices) to shuffle the patch tokens,
even in eval mode; with ``mask_ratio`` 0 nothing is dropped and the encoder does not depend on the order. A
random tensor whose readers take only its shape or its order (Shape, Size, the indices of TopK, ArgMax,
ArgMin) is replaced by an int32 fill of zeros: equal values sort in index order (the ONNX tie rule), so the
shuffle becomes the identity, which is one of the draws the fake-quant model can make. The fill is made after
``fold_constants`` so that it stays a node, and :func:`check_draws_ignored` then runs the converted model with
fresh random fills in its place: if any output changes, the model's result depends on the draw and the
conversion is refused (random values read as numbers are refused by ``normalize``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from ivit_onnx.errors import ConversionError, one_line
from ivit_onnx.graph import constant, node_label
from ivit_onnx.pipeline import Context, Pass

#: random ops (ONNX's generators); the ``*Like`` ones take their shape from their input
RANDOM = ("RandomUniformLike", "RandomNormalLike", "RandomUniform", "RandomNormal")
#: readers that see only the shape of a tensor, or only the order of its values
_ORDER_READERS = ("Shape", "Size", "TopK", "ArgMax", "ArgMin")
#: draws per check, each a fresh random fill
DRAWS = 3


def _order_only(t: gs.Tensor, outputs: set[str]) -> bool:
    """Every reader of ``t`` takes only its shape or its order (TopK's values output unread)."""
    if t.name in outputs or not t.outputs:
        return False
    for reader in t.outputs:
        if reader.op not in _ORDER_READERS:
            return False
        if reader.op == "TopK" and (reader.inputs[0] is not t or reader.outputs[0].outputs
                                    or reader.outputs[0].name in outputs):
            return False
    return True


class FixRandom(Pass):
    name = "fix_random"
    ops = RANDOM
    ops_how = ("read only for its shape or order (a shuffle) and the outputs do not depend on the draw: "
               "`passes/fix_random.py` fixes one draw; read as numbers: refused (`normalize`)")

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        outputs = {t.name for t in g.outputs}
        changed = False
        for node in [n for n in g.nodes if n.op in RANDOM]:
            out = node.outputs[0]
            if not _order_only(out, outputs):
                continue  # read as numbers: normalize refuses it, saying why
            like = node.inputs[0] if node.op.endswith("Like") else None
            if like is not None and like.inputs and like.inputs[0].op == "ConstantOfShape":
                shape = like.inputs[0].inputs[0]  # the shape the float template was made from
            elif like is not None:
                shape = gs.Variable(f"{out.name}/shape", dtype=np.int64)
                g.nodes.append(gs.Node("Shape", f"{node.name}/shape", {}, [like], [shape]))
            else:
                shape = constant(f"{out.name}/shape", np.asarray(node.attrs["shape"], dtype=np.int64))
            zero = helper.make_tensor("value", onnx.TensorProto.INT32, [1], [0])
            fill = gs.Variable(f"{out.name}/fixed_draw", dtype=np.int32, shape=out.shape)
            g.nodes.append(
                gs.Node("ConstantOfShape", f"{node.name}/fixed_draw", {"value": zero}, [shape], [fill])
            )
            for reader in list(out.outputs):
                for i, x in enumerate(reader.inputs):
                    if x is out:
                        reader.inputs[i] = fill
                if reader.op == "TopK":  # its (unread) values are the fill's type now
                    reader.outputs[0].dtype = np.int32
            node.outputs.clear()
            ctx.notes.setdefault("fixed_random", {})[node_label(node)] = fill.name
            ctx.count(self.name, "random order fixed")
            changed = True
        if changed:
            g.cleanup().toposort()
        return changed


def _with_fresh_draws(model: onnx.ModelProto, fills: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose fixed draws are random again: each fill of zeros becomes uniform integers
    in [0, 2**24) of the same shape, so every run sorts them into a new order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    del out.graph.node[:]
    for n in nodes:
        if n.op_type != "ConstantOfShape" or n.output[0] not in fills:
            out.graph.node.append(n)
            continue
        zeros, noise = f"{n.output[0]}/zeros", f"{n.output[0]}/noise"
        out.graph.node.extend([
            helper.make_node("ConstantOfShape", [n.input[0]], [zeros], name=f"{n.name}/zeros",
                             value=helper.make_tensor("value", onnx.TensorProto.FLOAT, [1], [0.0])),
            helper.make_node("RandomUniformLike", [zeros], [noise], name=f"{n.name}/noise",
                             low=0.0, high=float(2**24)),
            helper.make_node("Cast", [noise], [n.output[0]], name=f"{n.name}/cast",
                             to=onnx.TensorProto.INT32),
        ])
    return out


def check_draws_ignored(model: onnx.ModelProto, fixed: dict[str, str]) -> None:
    """Refuse, naming the random op, if the converted model's outputs change when its fixed draws are drawn
    again (stock onnxruntime on the function bodies: exact integers, so any change is the draw's)."""
    from ivit_onnx.bench import make_feeds
    from ivit_onnx.runners import make_runner

    where = ", ".join(fixed)
    try:
        feeds = make_feeds(model, _batch(model), "random draw check", seed=0)
        want = make_runner("functions", model).run(feeds)
        fresh = make_runner("functions", _with_fresh_draws(model, list(fixed.values())))
        changed = [k for _ in range(DRAWS) for k, v in fresh.run(feeds).items()
                   if not np.array_equal(v, want[k])]
    except ConversionError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors, reported in one line
        raise ConversionError(f"{where}: the check of its fixed random order failed: {one_line(e)}") from None
    if changed:
        raise ConversionError(
            f"{where}: the outputs depend on the random numbers drawn here at run time (output "
            f"'{changed[0]}' changes from draw to draw): export with that tensor fixed (ViTMAE: noise=, or "
            "mask_ratio=0 so that its shuffle drops nothing), or deploy the weights in a class without it "
            "(MAE weights load into ViTModel)"
        )


def _batch(model: onnx.ModelProto) -> int:
    """The batch the check runs at: the first input's fixed first dimension, else 2."""
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            return dims[0].dim_value
    return 2

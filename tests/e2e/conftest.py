"""End-to-end fixtures: every input kind, built from the bundled (trained) digits ViT, on real images."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")


def _rebuild_torch(fp32: onnx.ModelProto):
    """The trained torch ViT from the bundled FP32 ONNX: parameters by name; Linear weights, which the
    exporter stores transposed as MatMul operands, found through the bias Add that follows their MatMul."""
    from ivit_onnx.models.bundled import load_default_info
    from ivit_onnx.models.vit import vit

    cfg = {k: v for k, v in load_default_info()["model"].items() if k != "factory"}
    model = vit(**cfg)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in fp32.graph.initializer}
    producer = {o: n for n in fp32.graph.node for o in n.output}
    state = {}
    for name, p in model.state_dict().items():
        if name in inits:
            state[name] = torch.from_numpy(inits[name].copy())
            continue
        bias = name[: -len("weight")] + "bias"
        add = next(n for n in fp32.graph.node if n.op_type in ("Add", "Gemm") and bias in n.input)
        if add.op_type == "Gemm":
            w = inits[add.input[1]]
            state[name] = torch.from_numpy(
                (w if any(a.name == "transB" and a.i for a in add.attribute) else w.T).copy()
            )
            continue
        mm = producer[next(i for i in add.input if i != bias)]
        state[name] = torch.from_numpy(inits[mm.input[1]].T.copy())
        assert state[name].shape == p.shape, name
    model.load_state_dict(state)
    return model.eval()


@pytest.fixture(scope="session")
def digits():
    from ivit_onnx.models.digits import load_digits_split

    return load_digits_split()


@pytest.fixture(scope="session")
def digits_fp32_path():
    from ivit_onnx.models.bundled import default_fp32_path

    return default_fp32_path()


@pytest.fixture(scope="session")
def digits_torch(digits_fp32_path, digits):
    model = _rebuild_torch(onnx.load(digits_fp32_path))
    with torch.no_grad():
        ref = model(torch.from_numpy(digits[2][:64])).numpy()
    import onnxruntime as ort

    sess = ort.InferenceSession(str(digits_fp32_path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ref, sess.run(None, {sess.get_inputs()[0].name: digits[2][:64]})[0], atol=1e-4)
    return model


def distilled_copy(model):
    """A DeiT-style distilled twin: a distillation token and head that copy the class token and head, so
    the averaged logits equal the original model's (a real-data test of the distilled graph)."""
    from ivit_onnx.models.vit import vit

    cfg = dict(
        img_size=8,
        patch_size=2,
        in_chans=1,
        num_classes=10,
        embed_dim=model.cls_token.shape[-1],
        depth=len(model.blocks),
        num_heads=model.blocks[0].attn.num_heads,
        mlp_ratio=model.blocks[0].mlp.fc1.out_features / model.cls_token.shape[-1],
        distilled=True,
    )
    twin = vit(**cfg)
    state = copy.deepcopy(model.state_dict())
    state["dist_token"] = state["cls_token"].clone()
    state["pos_embed"] = torch.cat([state["pos_embed"][:, :1], state["pos_embed"]], dim=1)
    state["head_dist.weight"] = state["head.weight"].clone()
    state["head_dist.bias"] = state["head.bias"].clone()
    twin.load_state_dict(state)
    return twin.eval()


def _own_fq(tmp_path_factory, model, digits, name, export=None, **quant):
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize

    x_train = digits[0]
    calib = [torch.from_numpy(x_train[i : i + 256]) for i in range(0, len(x_train), 256)]
    fq = quantize(model, calib, **quant)
    path = tmp_path_factory.mktemp("fq") / f"{name}.onnx"
    export_onnx(fq, torch.from_numpy(digits[2][:2]), path, **(export or {}))
    return path


OWN = {
    "torchscript": dict(exporter="torchscript"),
    "dynamo": dict(exporter="dynamo"),
    "residual16": dict(exporter="torchscript", residual_bits=16),
    "uint8_split_qkv": dict(exporter="torchscript", act_dtype="uint8", qkv="split"),
    "opset14_decomposed_layernorm": dict(exporter="torchscript", opset=14),
}


def _tanh_twin(model):
    """The same weights with tanh-form GELU (exporters then emit the tanh pattern)."""
    from ivit_onnx.models.bundled import load_default_info
    from ivit_onnx.models.vit import vit

    cfg = {k: v for k, v in load_default_info()["model"].items() if k != "factory"}
    twin = vit(**cfg, gelu="tanh")
    twin.load_state_dict(model.state_dict())
    return twin.eval()


@pytest.fixture(scope="session", params=sorted(OWN) + ["distilled", "tanh_gelu"])
def own_fq(request, tmp_path_factory, digits_torch, digits):
    """(name, path) of a fake-quant export of the trained digits ViT: each exporter and quantizer form."""
    name = request.param
    if name == "distilled":
        return name, _own_fq(tmp_path_factory, distilled_copy(digits_torch), digits, name)
    if name == "tanh_gelu":
        return name, _own_fq(tmp_path_factory, _tanh_twin(digits_torch), digits, name)
    opts = dict(OWN[name])
    export = {k: opts.pop(k) for k in ("exporter", "opset") if k in opts}
    return name, _own_fq(tmp_path_factory, digits_torch, digits, name, export, **opts)

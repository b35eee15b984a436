"""Loading models with one-line errors: missing file, not ONNX, truncated, unreadable IR."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from .errors import ConversionError, first_line, one_line

#: onnxruntime 1.31 reads IR versions up to this
MAX_IR_VERSION = 10


def load_model(model, base_dir=None) -> onnx.ModelProto:
    """A ModelProto from a path or a ModelProto (copied), or :class:`ConversionError`.

    Tensors stored as external data are read in: from the model file's folder, or for a ModelProto from
    ``base_dir`` (default: the current folder).
    """
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        load_external_data(out, os.fspath(base_dir or os.getcwd()), "model")
        return out
    path = os.fspath(model)
    if os.path.isdir(path):
        raise ConversionError(f"{path}: is a folder, not an ONNX file")
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            proto = onnx.ModelProto.FromString(f.read())
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ConversionError(f"{path}: not an ONNX model or truncated ({type(e).__name__})") from None
    if not proto.graph.node:
        raise ConversionError(f"{path}: not an ONNX model (no graph nodes)")
    check_names(proto, path)
    load_external_data(proto, os.path.dirname(os.path.abspath(path)), path)
    try:
        onnx.checker.check_model(skeleton(proto))
    except onnx.checker.ValidationError as e:
        raise ConversionError(f"{path}: invalid ONNX model: {first_line(e)}") from None
    except UnicodeDecodeError:  # the checker's message quotes bytes that are not UTF-8
        raise ConversionError(f"{path}: invalid ONNX model (corrupted bytes)") from None
    return proto


def check_names(model: onnx.ModelProto, where: str) -> None:
    """Read every string of the model once: protobuf decodes them lazily, so a corrupted file whose strings
    are not UTF-8 would otherwise fail deep inside a pass. Weights (bytes and numbers) are not touched."""
    try:
        _read_strings(model)
    except UnicodeDecodeError:
        raise ConversionError(f"{where}: corrupted ONNX file (a name or string is not valid UTF-8)") from None


def _read_strings(msg) -> None:
    for fd in msg.DESCRIPTOR.fields:
        repeated = fd.is_repeated
        if fd.type == fd.TYPE_MESSAGE:
            if repeated:
                for m in getattr(msg, fd.name):
                    _read_strings(m)
            elif msg.HasField(fd.name):
                _read_strings(getattr(msg, fd.name))
        elif fd.type == fd.TYPE_STRING:
            list(getattr(msg, fd.name)) if repeated else getattr(msg, fd.name)


def _stored_tensors(model: onnx.ModelProto):
    """Initializers and Constant-node tensors of the main graph (where exporters put external data)."""
    yield from model.graph.initializer
    for n in model.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t


def load_external_data(model: onnx.ModelProto, base_dir: str, where: str) -> None:
    """Read every external tensor into the model (in place), checking locations and lengths first."""
    for t in _stored_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc or os.path.isabs(loc) or ".." in loc.replace("\\", "/").split("/"):
            raise ConversionError(
                f"{where}: tensor '{t.name}': external data location {loc!r} must be a "
                "file name relative to the model's folder"
            )
        file = os.path.join(base_dir, loc)
        if not os.path.isfile(file):
            hint = "" if where != "model" else " (pass base_dir=, the folder of the .onnx file)"
            raise ConversionError(
                f"{where}: tensor '{t.name}' is stored in '{loc}', which is not a file in {base_dir}{hint}"
            )
        try:
            offset, length = int(info.get("offset") or 0), int(info.get("length") or -1)
        except ValueError:
            raise ConversionError(f"{where}: tensor '{t.name}': bad external data offset/length") from None
        with open(file, "rb") as f:
            f.seek(max(offset, 0))
            data = f.read(length)
        if offset < 0 or (length >= 0 and len(data) != length):
            raise ConversionError(
                f"{where}: tensor '{t.name}': '{loc}' is too short for offset {offset}, "
                f"length {length} (truncated?)"
            )
        t.raw_data = data
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


#: initializers larger than this (bytes) are left out of :func:`skeleton`
_SKELETON_LIMIT = 4096


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with large initializers turned into typed graph inputs: checks and shape inference on it
    cost no copy of the weights (small initializers, such as Reshape targets, stay as values)."""
    out = onnx.ModelProto()
    out.ir_version, out.producer_name = model.ir_version, model.producer_name
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    g = out.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    names = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if t.ByteSize() <= _SKELETON_LIMIT:
            g.initializer.append(t)
        elif t.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> np.ndarray:
    """QuantizeLinear's semantics in numpy: round half to even, saturate to the zero point's type."""
    if scale.size > 1:
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    info = np.iinfo(zp.dtype)
    q = np.rint(x.astype(np.float64) / scale) + zp.astype(np.float64)
    return np.asarray(np.clip(q, info.min, info.max).astype(zp.dtype))  # 0-d stays an array, not a scalar


def fold_quantized_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A new model in which QuantizeLinear of float initializers (torch's weight export) is an integer
    initializer. Built as a fresh message so the caller can drop the old one: protobuf arenas free the
    float weights only with the whole message, and peak memory stays near one copy of the file."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    folded: dict[str, np.ndarray] = {}
    for n in g.node:
        if (
            n.op_type == "QuantizeLinear"
            and n.input[0] in inits
            and all(i in inits for i in n.input[1:] if i)
            and len(n.input) >= 3
            and n.input[2]
        ):
            x, scale = numpy_helper.to_array(inits[n.input[0]]), numpy_helper.to_array(inits[n.input[1]])
            if x.dtype.kind == "f" and np.all(np.isfinite(scale)) and np.all(scale > 0):  # else refused later
                a = next((a.i for a in n.attribute if a.name == "axis"), 1)
                folded[n.output[0]] = quantize(x, scale, numpy_helper.to_array(inits[n.input[2]]), a)
    if not folded:
        return model
    out = onnx.ModelProto()
    out.ir_version, out.producer_name, out.producer_version = (
        model.ir_version,
        model.producer_name,
        model.producer_version,
    )
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.metadata_props.extend(model.metadata_props)
    og = out.graph
    og.name = g.name
    og.node.extend(n for n in g.node if n.output[0] not in folded or n.op_type != "QuantizeLinear")
    og.input.extend(g.input)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    used = {i for n in og.node for i in n.input} | {o.name for o in g.output}
    og.initializer.extend(t for t in g.initializer if t.name in used)
    og.initializer.extend(numpy_helper.from_array(q, name) for name, q in folded.items())
    return out


#: the function bodies use CastLike (opset 15)
MIN_OPSET = 15


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain (``""``/``ai.onnx``) opset version, 0 when it imports none."""
    return next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)


def ensure_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Models at opset 13 or 14 are converted up to 15: the private ops' bodies need CastLike."""
    version = default_opset(model)
    if version >= MIN_OPSET or version < 13:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises several types; one line for the user
        raise ConversionError(
            f"cannot upgrade opset {version} to {MIN_OPSET}: {first_line(e)}"
        ) from None


# ------------------------------------------------------------------------------------------- writing

#: a protobuf message cannot exceed 2 GiB; larger models are written with their weights in a .data file
MAX_PROTO_BYTES = 2**31 - 2**20
#: tensors at least this large (bytes) go to the .data file when writing external data
EXTERNAL_MIN_BYTES = 1024


def _file_mode() -> int:
    """The mode ``open()`` would give a new file: 0o666 minus the process umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def check_output_path(path) -> str:
    """Fail early, naming ``path``, when it cannot be written: a folder, or in a folder that is missing."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConversionError(f"{path}: is a folder; give a file name")
    if not os.path.isdir(folder):
        raise ConversionError(f"{path}: the output folder {folder} does not exist")
    return path


@contextmanager
def atomic_output(path):
    """Yield a temporary path next to ``path``; on success it becomes ``path`` (mode from the umask),
    on any failure it is removed: a failed write never leaves a partial file."""
    path = check_output_path(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise ConversionError(f"{path}: cannot write in {folder} ({e.strerror})") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        raise ConversionError(f"{path}: cannot write ({e.strerror or one_line(e)})") from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def save_model(model: onnx.ModelProto, path, external_data: bool | None = None) -> None:
    """Write atomically: a failure never leaves a half-written file.

    ``external_data``: None writes the weights to ``<path>.data`` only when the model is over 2 GiB
    (protobuf's limit); True always; False never. The model is unchanged afterwards.
    """
    if external_data is None:
        external_data = model.ByteSize() > MAX_PROTO_BYTES
    if not external_data:
        with atomic_output(path) as tmp, open(tmp, "wb") as f:
            f.write(model.SerializeToString())
        return
    data_path = os.fspath(path) + ".data"
    moved = [
        t
        for t in _stored_tensors(model)
        if t.data_location != onnx.TensorProto.EXTERNAL and len(t.raw_data) >= EXTERNAL_MIN_BYTES
    ]
    with atomic_output(path) as tmp, atomic_output(data_path) as tmp_data:  # the data lands first
        try:
            _move_out(moved, tmp_data, os.path.basename(data_path))
            with open(tmp, "wb") as f:
                f.write(model.SerializeToString())
        finally:
            _move_back(moved, tmp_data)


def _move_back(tensors: list, data_file: str) -> None:
    """Undo :func:`_move_out`: the bytes back into the tensors, the external-data entries removed."""
    with open(data_file, "rb") as f:
        for t in tensors:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in t.external_data}
            f.seek(int(info["offset"]))
            t.raw_data = f.read(int(info["length"]))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


def _move_out(tensors: list, data_file: str, location: str) -> None:
    """Append each tensor's bytes to ``data_file`` (64-byte aligned) and point it there as ``location``."""
    with open(data_file, "wb") as f:
        for t in tensors:
            pad = -f.tell() % 64
            f.write(b"\0" * pad)
            offset, raw = f.tell(), t.raw_data
            f.write(raw)
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
                t.external_data.add(key=k, value=v)

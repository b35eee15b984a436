"""Rewrite time and peak memory vs ``onnx.load`` + ``onnx.save`` of the same file, printed as ratios.

    python benchmarks/bench_rewrite.py [--models deit_tiny deit_small deit_base vit_large_ext] [--out DIR]

Each measurement runs in a fresh subprocess (so peak RSS is its own); the baseline and the rewrite of a
model are measured side by side in the same run. Peak RSS is reported above the process's RSS after
imports, against the model's size on disk (targets: time ratio <= 3, peak RSS <= 3x the file size).
A name ending in ``_ext`` is stored with external data (``NAME.onnx`` + ``NAME.onnx.data``, as every model
over 2 GB must be): ``vit_large_ext`` is ViT-Large/16 (304M parameters, random weights), and its baseline
loads and saves it with external data too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
import onnx
import ivit_onnx
from ivit_onnx import rewrite
def status_mb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
mode, src, dst = sys.argv[1:4]
base = status_mb("VmRSS")
t = time.perf_counter()
if mode == "loadsave":
    ext = os.path.exists(src + ".data")  # keep the input's storage: external data in, external data out
    onnx.save(onnx.load(src), dst, save_as_external_data=ext, location=os.path.basename(dst) + ".data")
else:
    rewrite(src, dst)
dt = time.perf_counter() - t
peak = status_mb("VmHWM")  # ru_maxrss survives execve from the parent; VmHWM does not
print(json.dumps({"seconds": dt, "peak_above_imports_mb": peak - base}))
"""


def _export(name: str, path: Path) -> None:
    import onnx
    import torch

    from ivit_onnx.models import vit
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize

    torch.manual_seed(0)
    base = name.removesuffix("_ext")
    if base == "vit_large":  # timm vit_large_patch16_224: dim 1024, depth 24, 16 heads
        model = vit.vit(224, 16, 3, 1000, 1024, 24, 16)
    else:
        model = getattr(vit, f"{base}_patch16_224")()
    calib = [torch.randn(2 if base != "vit_large" else 1, 3, 224, 224)]
    export_onnx(quantize(model, calib), calib[0], path)
    if name.endswith("_ext"):
        del model
        onnx.save(onnx.load(path), path, save_as_external_data=True, location=path.name + ".data")


def _size_mb(path: Path) -> float:
    data = path.with_name(path.name + ".data")
    return (path.stat().st_size + (data.stat().st_size if data.exists() else 0)) / 2**20


def _measure(mode: str, src: Path, dst: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(src), str(dst)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["deit_tiny", "deit_small", "deit_base", "vit_large_ext"])
    ap.add_argument("--out", default=None, help="folder for the exported models (default: a temp dir)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="ivit_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{'model':12s} {'file MB':>8s} {'load+save s':>11s} {'rewrite s':>9s} {'time x':>7s} "
        f"{'peak MB':>8s} {'peak/file':>9s}"
    )
    for name in args.models:
        src = out / f"{name}_fq.onnx"
        if not src.exists():
            _export(name, src)
        size = _size_mb(src)
        base = _measure("loadsave", src, out / f"{name}_copy.onnx")
        conv = _measure("rewrite", src, out / f"{name}_int.onnx")
        print(
            f"{name:12s} {size:8.1f} {base['seconds']:11.2f} {conv['seconds']:9.2f} "
            f"{conv['seconds'] / base['seconds']:7.2f} {conv['peak_above_imports_mb']:8.1f} "
            f"{conv['peak_above_imports_mb'] / size:9.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

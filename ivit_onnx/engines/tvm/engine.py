"""The TVM engine behind the :class:`~ivit_onnx.engines.base.Engine` interface: compile builds and exports
``.so`` + ``.json`` (:mod:`.compile`), load opens :class:`.session.TvmSession` on it."""

from __future__ import annotations

import os
import time

from ..base import Engine


def backend(where: str = ""):
    """The TVM backend module (:mod:`.compile`), or a one-line error saying which extra to install."""
    from ivit_onnx.errors import ConversionError, one_line

    try:
        from . import compile as tvm_compile
    except ImportError as e:
        prefix = f"{where}: " if where else ""
        raise ConversionError(
            f"{prefix}TVM is not installed ({e.name or one_line(e)}): pip install 'ivit-onnx[tvm]'"
            + ("" if where else " (from a checkout: pip install '.[tvm]')")
        ) from None
    return tvm_compile


class TvmEngine(Engine):
    """TVM's relax build (llvm on the CPU, cuda): artifact ``.so`` with a ``.json`` sidecar."""

    name, suffix = "tvm", ".so"
    bench_label, exact_label, compiles = "int: tvm (llvm)", "tvm", True

    def add_arguments(self, parser) -> None:
        parser.add_argument("--target", choices=["llvm", "cuda"], default="llvm",
                            help="TVM target (default llvm)")
        parser.add_argument("--arch", help="GPU architecture for cuda, e.g. sm_80, sm_90")
        parser.add_argument("--tune", type=int, default=0, metavar="N",
                            help="meta-schedule trials (default 0: none)")
        parser.add_argument("--tune-db", metavar="DIR", help="persistent meta-schedule database directory")

    def require(self, where: str) -> None:
        backend(where)

    def compile(self, model_arg: str, output: str, args) -> int:
        import shutil
        import tempfile
        from pathlib import Path

        from ivit_onnx.cli import Heartbeat, compile_shapes
        from ivit_onnx.errors import ConversionError, one_line
        from ivit_onnx.io import check_output_path, load_model
        from ivit_onnx.models.bundled import resolve

        tvm_compile = backend()
        out = Path(check_output_path(output))
        model = load_model(resolve(model_arg))
        shapes = compile_shapes(model, args.shape, model_arg)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            with Heartbeat("compile", enabled=not args.quiet) as beat:
                try:
                    art = tvm_compile.compile_model(model, target=args.target, arch=args.arch,
                                                    tune_trials=args.tune, tune_db=args.tune_db, shape=shapes,
                                                    progress=beat)
                    beat("exporting")
                    tvm_compile.export(art, tmp / out.name)
                except (ConversionError, MemoryError, KeyboardInterrupt):
                    raise
                except Exception as e:  # noqa: BLE001 - TVM raises many types; one line naming the model
                    raise ConversionError(f"{model_arg}: TVM cannot compile it ({one_line(e)})") from None
            os.replace(tmp / out.with_suffix(".json").name, out.with_suffix(".json"))
            os.replace(tmp / out.name, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        kind, n = art.target.get("kind"), art.info.get("int8_matmuls")
        print(f"wrote {output} (target {kind}, int8 matmuls {n})")
        return 0

    def load(self, path, threads: int | None = None):
        backend()
        from .session import TvmSession

        return TvmSession(path)

    def session(self, model, threads: int | None = None, shapes: dict | None = None, **options):
        """An llvm build of ``model`` for ``shapes`` (``threads``: TVM's pool, read at its first run)."""
        from ivit_onnx.errors import ConversionError, one_line

        from .session import TvmSession

        if threads:
            os.environ["TVM_NUM_THREADS"] = str(threads)
        tvm_compile = backend("--engines tvm")
        t0 = time.perf_counter()
        try:
            art = tvm_compile.compile_model(model, target="llvm", shape=shapes)
        except (ConversionError, MemoryError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - TVM raises many types
            raise ConversionError(f"--engines tvm: TVM cannot compile the model ({one_line(e)})") from None
        session = TvmSession(artifact=art)
        session.compile_s = time.perf_counter() - t0
        return session

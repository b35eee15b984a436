"""Regenerate the command outputs quoted in README.md and docs/*.md, so they cannot drift from the code.

    python benchmarks/readme_outputs.py            # rewrite the files in place (slow commands too)
    python benchmarks/readme_outputs.py --check    # exit 1 if an output differs (skips slow commands)
    python benchmarks/readme_outputs.py --skip-slow  # rewrite, leaving the TVM builds' outputs as they are
    python benchmarks/readme_outputs.py docs/tvm.md  # only the files named (paths from the repository root)

A quoted output is a fenced block whose lines start with ``$ command``; the lines after it, up to the next
``$`` line or the end of the block, are replaced with what the command prints on stdout. The commands of one
file run in order in one temporary folder (a later one may read what an earlier one wrote); each file gets a
folder of its own. Paths inside the checkout are written relative (``models/x.onnx``, not an absolute path).
Figures that differ between runs, builds and machines (throughput, ``ivit-onnx bench``'s timings, device line
and engine notes, validate's backend notes) are compared as placeholders (:func:`normalize`); the rest of
each output, its structure included, must match.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = "```"
#: commands that take minutes (TVM builds and runs: a .so artifact, or bench with the tvm engine); regenerated
#: by default, skipped by --check and --skip-slow. The onnxruntime engine's compile and run are fast.
SLOW = re.compile(r"^ivit-onnx (compile|run|bench) (.*\.so\b|.*--engines?[ =]\S*tvm)")
#: names of ``ivit-onnx bench``'s rows (``int: onnxruntime (library)``, ``fp32: openvino``, ``qdq: openvino``)
_BENCH_ROW = r"(?:int|fp32|qdq): [^:\n]+?"
VOLATILE = [
    (re.compile(r"\d+(\.\d+)? samples/s"), "<n> samples/s"),
    # validate's backend notes depend on the build (native kernels or not) and the CPU (GEMM self-check)
    (re.compile(r"^( {12}\w+: ).*$", re.M), r"\1<backend note>"),
    # ivit-onnx bench: the machine, every timing column, the engines' and peers' notes, compile times
    (re.compile(r"^device: .*$", re.M), "device: <device>"),
    (re.compile(rf"^({_BENCH_ROW}) +\d+\.\d+ +\d+\.\d+ +\d+\.\d+ +(?:\d+\.\d+|-)$", re.M), r"\1 <timings>"),
    (re.compile(rf"^({_BENCH_ROW}): .*$", re.M), r"\1: <note>"),
    (re.compile(r"^(compile: \S+) \d+(\.\d+)? s\b", re.M), r"\1 <n> s"),
]


def normalize(text: str) -> str:
    """The text with run-to-run (and machine-to-machine) varying figures replaced by placeholders."""
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return text


def documents() -> list[Path]:
    """The files whose quoted outputs are checked: README.md, then docs/*.md."""
    return [README, *sorted(DOCS.glob("*.md"))]


def blocks(lines: list[str]) -> list[tuple[int, int, str]]:
    """``(first output line, end line (exclusive), command)`` of every quoted command, in file order."""
    out, inside = [], False
    for i, line in enumerate(lines):
        if line.startswith(FENCE):
            inside = not inside
            continue
        if inside and line.startswith("$ "):
            end = i + 1
            while not lines[end].startswith(FENCE) and not lines[end].startswith("$ "):
                end += 1
            out.append((i + 1, end, line[2:].strip()))
    return out


def run(command: str, cwd: str) -> str:
    """stdout of one quoted command (``ivit-onnx`` and ``python`` are this interpreter's)."""
    argv = shlex.split(command)
    if argv[0] == "ivit-onnx":
        argv = [sys.executable, "-m", "ivit_onnx.cli", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    env = {**os.environ, "COLUMNS": "110", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"{command!r} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return r.stdout.rstrip("\n").replace(str(ROOT) + os.sep, "")


def regenerate(text: str, skip_slow: bool) -> tuple[str, list[str]]:
    """The file's text with every quoted output rerun; also the commands whose output changed."""
    lines = text.split("\n")
    with tempfile.TemporaryDirectory() as cwd:  # in file order: later commands read earlier outputs
        done = [(s, e, c, run(c, cwd)) for s, e, c in blocks(lines) if not (skip_slow and SLOW.match(c))]
    changed = []
    for start, end, command, new in reversed(done):
        if normalize("\n".join(lines[start:end])) != normalize(new):
            changed.append(command)
            lines[start:end] = new.split("\n") if new else []
    return "\n".join(lines), changed[::-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="only these files (default: README.md and docs/*.md)")
    ap.add_argument(
        "--check", action="store_true", help="report differences, change nothing (no slow commands)"
    )
    ap.add_argument("--skip-slow", action="store_true", help="leave the outputs of slow commands as they are")
    args = ap.parse_args(argv)
    paths = [ROOT / f for f in args.files] if args.files else documents()
    drifted = 0
    for path in paths:
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        text = path.read_text()
        new, changed = regenerate(text, skip_slow=args.check or args.skip_slow)
        drifted += len(changed)
        if args.check:
            for c in changed:
                print(f"{name}: output differs: $ {c}")
            continue
        if new != text:
            path.write_text(new)
        print(f"{name}: {len(changed)} output(s) updated" + (f" ({'; '.join(changed)})" if changed else ""))
    return 1 if args.check and drifted else 0


if __name__ == "__main__":
    sys.exit(main())

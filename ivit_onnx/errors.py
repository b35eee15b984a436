"""The exception type for bad input, and how every command prints it: one line, one prefix, no traceback."""

from __future__ import annotations

import sys

#: every command's error lines start with this (``ivit-onnx rewrite|validate|compile|run``)
PREFIX = "ivit-onnx: error:"


class ConversionError(Exception):
    """Bad or unsupported input; ``str(err)`` is one line naming the offending file, node or tensor."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """The first line of an exception's text, with its type when the text does not say much."""
    text = str(e).strip()
    first = text.splitlines()[0][:limit] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def os_error_line(e: OSError) -> str:
    """``path: reason`` for an OSError (the path it names, not a temporary file's)."""
    why = e.strerror or one_line(e)
    return f"{e.filename}: {why}" if e.filename else why


def print_error(message: str) -> None:
    """Print ``ivit-onnx: error: message`` on stderr, on one line."""
    text = " ".join(str(message).split("\n")).strip()
    print(f"{PREFIX} {text}", file=sys.stderr)

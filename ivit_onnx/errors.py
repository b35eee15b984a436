"""The exception type for bad input, and how every command prints it: one line, one prefix, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

#: every command's error lines start with this (``ivit-onnx rewrite|validate|compile|run``)
PREFIX = "ivit-onnx: error:"


class ConversionError(Exception):
    """Bad or unsupported input; ``str(err)`` is one line naming the offending file, node or tensor."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first line of an exception's text (at most ``limit`` characters), or its type when it has none."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


def one_line(e: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of an exception (its type alone when it has no text)."""
    first = first_line(e, limit)
    return f"{type(e).__name__}: {first}" if first != type(e).__name__ else first


def os_error_line(e: OSError) -> str:
    """``path: reason`` for an OSError (the path it names, not a temporary file's)."""
    why = e.strerror or one_line(e)
    return f"{e.filename}: {why}" if e.filename else why


def print_error(message: str) -> None:
    """Print ``ivit-onnx: error: message`` on stderr, on one line."""
    text = " ".join(str(message).split("\n")).strip()
    print(f"{PREFIX} {text}", file=sys.stderr)


def guarded(command: Callable[[], int]) -> int:
    """Run a command's body; every failure becomes one ``ivit-onnx: error:`` line and exit code 2
    (argparse's own exits pass through: 0 for --help, 2 for a usage error it already printed)."""
    try:
        return command()
    except ConversionError as e:
        print_error(e)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except OSError as e:
        print_error(os_error_line(e))
    except MemoryError:
        print_error("out of memory")
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - last resort: still one line, never a traceback
        print_error(f"internal error ({one_line(e)}); please report it with the command line")
    return 2

"""The C engine: an integer model as self-contained, integer-only C99 (``model.c`` + ``model.h``) for
microcontrollers and C high-level-synthesis flows: fixed-width integer types, no float, no libm, no malloc,
one static arena, weights as ``const`` arrays (:mod:`.plan`, :mod:`.emit`, :mod:`.runtime`); on the host it
runs compiled with the system C compiler through ctypes (:mod:`.session`).
"""

from .engine import CEngine, generate

__all__ = ["CEngine", "generate"]

"""The graph passes, one per module; ``default_passes()`` is the converter's pipeline, in order."""

from __future__ import annotations

from .attach_functions import AttachFunctions
from .expand_einsum import ExpandEinsum
from .expand_norms import ExpandNorms
from .finalize import Finalize
from .fix_random import FixRandom
from .fold_constants import FoldConstants
from .fuse_gelu import FuseGelu
from .fuse_l2norm import FuseL2Norm
from .fuse_layernorm import FuseLayerNorm
from .fuse_softmax import FuseSoftmax
from .lower_integer import LowerInteger
from .normalize import Normalize

#: the converter's passes, in order (``Pipeline.default()`` instantiates them)
PASSES = (
    FoldConstants,
    FixRandom,
    Normalize,
    ExpandNorms,
    ExpandEinsum,
    FuseGelu,
    FuseLayerNorm,
    FuseL2Norm,
    FuseSoftmax,
    LowerInteger,
    AttachFunctions,
    Finalize,
)


def default_passes():
    """fold_constants → fix_random → normalize → expand_norms → expand_einsum → fuse_gelu → fuse_layernorm →
    fuse_l2norm → fuse_softmax → lower_integer → attach_functions → finalize."""
    return [p() for p in PASSES]


__all__ = [p.__name__ for p in PASSES] + ["PASSES", "default_passes"]

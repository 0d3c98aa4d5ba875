"""Inputs handed to a kernel by address: the agents' raw blocks as one int64 array of addresses
(their format codes beside), not a tuple of arrays.

Why: a tuple's length and its arrays' dtype are part of a compiled kernel's signature, so every
agent count and carrier compiled each merge kernel anew (tens of seconds a kernel, on a user's
first merge of four agents after one of three). An int64 array is one signature for any count;
the kernel decodes each agent by its code.

The arrays must stay alive and unchanged while the kernel runs: the caller holds the block's
views (``blocks.BlockArrays``) for the call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def voidptr(typingctx, address):  # type: ignore[no-untyped-def]
    """The address ``address`` (int64) as a pointer, for ``numba.carray``: a kernel writing K
    outputs takes their addresses in one int64 array, one compiled signature for every K.
    Anything but an integer (an array handed where an address belongs) fails to compile."""
    if not isinstance(address, types.Integer):
        return None
    sig = types.voidptr(types.int64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return sig, codegen


def addresses_of(blocks: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The int64 addresses of ``blocks``' data, each a C-contiguous block of ``size`` elements."""
    for block in blocks:
        if block.shape != (size,) or not block.flags.c_contiguous:
            raise ValueError(f"an input block must be C-contiguous with {size} elements, got {block.shape}")
    return np.array([block.ctypes.data for block in blocks], dtype=np.int64)

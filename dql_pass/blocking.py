"""How much array work takes at a time: a leaf, so that every layer that works through a large
array a block at a time (the reference, lower's operands and weights, verify's inputs) asks here."""

from __future__ import annotations

__all__ = ["BLOCK_ELEMENTS"]

# Elements made, widened or copied at a time where the whole array at once would take a copy many
# times its size (int8 widened to int64 is 8 times): 2^20 elements widened to 8 bytes is 8 MiB,
# small beside any model, and large enough that NumPy's cost per call over the blocks is negligible.
BLOCK_ELEMENTS = 1 << 20

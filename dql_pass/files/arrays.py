"""Input arrays read from ``.npy`` files a user names, with bounds: a file is read only once its
header is known to describe no more bytes than the file holds and than the budget allows, and only
a regular file (a FIFO would block the read for good); no pickled objects."""

from __future__ import annotations

__all__ = ["load_arrays"]

import math
import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dql_pass.errors import InputError, one_line

if TYPE_CHECKING:
    import numpy as np


def load_arrays(paths: Mapping[str, str], limit: int, option: str = "--input") -> dict[str, np.ndarray]:
    """The array of each ``name: path``, all of them together at most ``limit`` bytes; a file that
    cannot be read is an :class:`InputError` naming ``option`` and the name."""
    arrays: dict[str, np.ndarray] = {}
    for name, path in paths.items():
        budget = limit - sum(array.nbytes for array in arrays.values())
        try:
            arrays[name] = _load(path, budget, limit)
        except (OSError, ValueError) as error:
            raise InputError(f"{option} {name}: cannot read {path}: {one_line(error)}") from None
    return arrays


def _load(path: str, budget: int, limit: int) -> np.ndarray:
    import numpy as np

    headers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    with open(path, "rb") as file:
        version = np.lib.format.read_magic(file)
        read_header = headers.get(version)
        if read_header is None:
            raise ValueError(f"it is in .npy format version {version[0]}.{version[1]}; 1.0 and 2.0 are read")
        shape, _, dtype = read_header(file)
        available = os.fstat(file.fileno()).st_size - file.tell()
        if dtype.hasobject:
            raise ValueError("it holds Python objects, which are not loaded")
        needed = math.prod(shape) * dtype.itemsize
        if needed > available:
            raise ValueError(f"its header declares {needed:,} bytes of data, but the file holds {available:,}")
        if needed > budget:
            raise ValueError(f"with it the inputs would take more than the {limit >> 30} GiB verify allows")
        file.seek(0)
        return np.load(file, allow_pickle=False)

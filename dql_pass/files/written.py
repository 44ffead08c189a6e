"""What a file-to-file rewrite read and wrote: the paths as given, the time it took, the input's data
files the output shares, and a model's footprint on disk. The passes' results carry it and their
``format`` and ``to_dict`` say it."""

from __future__ import annotations

__all__ = ["Written", "footprint", "shared_lines", "written_dict"]

import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir


@dataclasses.dataclass(frozen=True)
class Written:
    """The model at ``source`` rewritten into ``output`` in ``seconds``; ``shared_data``: the input's data
    files the output refers to, with ``share_data`` (None without it)."""

    source: str
    output: str
    seconds: float
    shared_data: list[str] | None = None

    def done(self, what: str) -> str:
        """``what`` was done, into the output, in so many seconds."""
        return f"{what} into {self.output} in {self.seconds:.2f} s"

    def unchanged(self, why: str) -> str:
        return f"{self.source}: {why}; wrote it unchanged to {self.output} ({self.seconds:.2f} s)"

    def shared_lines(self) -> list[str]:
        """With --share-data, the input's data files the output refers to, said in a line of its own."""
        if self.shared_data is None:
            return []
        shared = self.shared_data
        if not shared:
            return [f"{self.output} stands alone: --share-data shares only the input's data files in the output's "
                    "folder, and this output keeps none"]
        many = len(shared) > 1
        return [f"{self.output} refers to the input's data {'files' if many else 'file'} {', '.join(shared)} "
                f"(--share-data): it needs {'them' if many else 'it'} where {'they are' if many else 'it is'}"]

    def to_dict(self) -> dict:
        return {"input": self.source, "output": self.output, "seconds": self.seconds}


def shared_lines(written: Written | None) -> list[str]:
    """A result's line on the data files its output shares (:meth:`Written.shared_lines`); none in memory."""
    return written.shared_lines() if written else []


def written_dict(written: Written | None, report: dict) -> dict:
    """A result's --json report: what ``written`` read and wrote, ``report``, then the input's data
    files the output shares (``[]`` without --share-data, or in memory), in that order."""
    return {**(written.to_dict() if written else {}), **report,
            "shared_data": (written.shared_data or []) if written else []}


def footprint(model: ir.Model, path: str | os.PathLike, data_files: Iterable[str | os.PathLike]) -> tuple[int, int]:
    """The nodes of ``model`` (every graph and function) and its size on disk: the file ``path`` that
    holds it and the ``data_files`` it refers to, as its load or save found them (no model is read)."""
    import onnx_ir as ir

    roots = (model.graph, *model.functions.values())
    nodes = sum(1 for root in roots for _ in ir.traversal.RecursiveGraphIterator(root))
    files = {os.path.realpath(path)} | {os.path.realpath(file) for file in data_files}
    return nodes, sum(os.path.getsize(file) for file in files if os.path.isfile(file))

"""Safe files, one home each: :mod:`~dql_pass.files.safe` (the output-path policy, atomic small
files, folder locks, signals held back, stage folders, the one-step exchange, the sweep: nothing
that knows a model's format), :mod:`~dql_pass.files.references` (which data files a folder's
models refer to, for the sweep), :mod:`~dql_pass.files.models` (checked loading, saving a model
with its data as one unit, built on ``safe``), :mod:`~dql_pass.files.tensors` (the tensor and
external-data inventory) and :mod:`~dql_pass.files.protobuf` (the protobuf a save writes).

Each name loads its module when first used, so that a small-file write costs no graph library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dql_pass.lazy import exports

_SAFE = [
    "FolderLock", "atomic_path", "check_not_system", "check_output_path", "data_file_name", "default_file_mode",
    "directory_entry", "entries_of", "fsync", "is_data_file", "put_folder", "signals_deferred", "stale_data", "staged",
    "sweep", "tidy_up",
]
_MODELS = ["as_ir_model", "load_model", "model_form", "read_model", "save_model"]
_TENSORS = ["ExternalData", "external_tensors", "in_memory"]
__all__ = sorted(_SAFE + _MODELS + _TENSORS)

if TYPE_CHECKING:
    from dql_pass.files.models import (  # noqa: F401
        as_ir_model, load_model, model_form, read_model, save_model,
    )
    from dql_pass.files.safe import (  # noqa: F401
        FolderLock, atomic_path, check_not_system, check_output_path, data_file_name, default_file_mode,
        directory_entry, entries_of, fsync, is_data_file, put_folder, signals_deferred, stale_data, staged, sweep,
        tidy_up,
    )
    from dql_pass.files.tensors import ExternalData, external_tensors, in_memory  # noqa: F401

_HOMES = {**dict.fromkeys(_SAFE, "safe"), **dict.fromkeys(_MODELS, "models"), **dict.fromkeys(_TENSORS, "tensors")}
__getattr__, __dir__ = exports(__name__, _HOMES)

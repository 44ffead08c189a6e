"""Safe files, one home each: :mod:`~dql_pass.files.safe` (the output-path policy, atomic small
files, folder locks, signals held back, stage folders, the one-step exchange, the sweep: nothing
that knows ONNX) and :mod:`~dql_pass.files.models` (checked loading, the external-data inventory,
saving a model with its data as one unit, built on ``safe``).

Each name loads its module when first used, so that a small-file write costs no graph library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dql_pass.lazy import exports

_SAFE = [
    "FolderLock", "atomic_path", "check_not_system", "check_output_path", "data_file_name", "default_file_mode",
    "directory_entry", "fsync", "is_data_file", "put_folder", "signals_deferred", "staged", "sweep", "tidy_up",
]
_MODELS = ["ExternalData", "as_ir_model", "external_tensors", "in_memory", "load_model", "save_model", "shared_data_files"]
__all__ = sorted(_SAFE + _MODELS)

if TYPE_CHECKING:
    from dql_pass.files.models import (
        ExternalData, as_ir_model, external_tensors, in_memory, load_model, save_model, shared_data_files,
    )
    from dql_pass.files.safe import (
        FolderLock, atomic_path, check_not_system, check_output_path, data_file_name, default_file_mode,
        directory_entry, fsync, is_data_file, put_folder, signals_deferred, staged, sweep, tidy_up,
    )

__getattr__, __dir__ = exports(__name__, {**dict.fromkeys(_SAFE, "safe"), **dict.fromkeys(_MODELS, "models")})

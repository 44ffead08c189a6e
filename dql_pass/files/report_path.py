"""Where a command's report (``--json``) may be written, and its atomic write.

A report replaces a file only if that file is a report of dql-pass too: whatever else it is (a model, in any
format, its weights, an input array, a suite's manifest) is never lost to a mistyped path. A report never lands
on a file the command reads or writes, nor inside a folder it writes.
"""

from __future__ import annotations

__all__ = ["check_report_path", "write_report"]

import json
import os
from collections.abc import Mapping
from pathlib import Path

from dql_pass.errors import InputError

_MAX_REPORT_BYTES = 64 << 20
_REPORT_KEYS = frozenset({"command", "exit_code"})  # what every report of dql-pass holds


def check_report_path(path: str, files: Mapping[str, str], folders: Mapping[str, str]) -> Path:
    """Refuse a report path that cannot be written, that is one of ``files`` or lies in one of
    ``folders`` (by what they are), or that holds anything but a report of dql-pass."""
    from dql_pass.files import check_output_path

    report = check_output_path(path, "report")
    for what, file in files.items():
        if Path(file).resolve() == report.resolve() or _same_file(file, report):
            raise InputError(f"{path}: the report would overwrite {what}; choose another path")
    # The report replaces a link itself, so the folder it lands in is the link's, not its target's.
    landing = Path(os.path.abspath(report)).parent.resolve() / report.name
    for what, folder in folders.items():
        if any(place.is_relative_to(Path(folder).resolve()) for place in (landing, report.resolve())):
            raise InputError(f"{path}: the report would be written into {what}; choose a path outside it")
    if not os.access(landing.parent, os.W_OK | os.X_OK):  # found before the command writes anything else
        raise InputError(f"{path}: cannot write the report: its folder {landing.parent} is not writable")
    if os.path.lexists(report):
        _check_not_data_of(path, report, files)
    try:
        if os.stat(report).st_size > _MAX_REPORT_BYTES:
            raise ValueError
        held = json.loads(report.read_bytes())
        if not (isinstance(held, dict) and _REPORT_KEYS <= held.keys()):
            raise ValueError
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        raise InputError(f"{path}: holds something other than a report of dql-pass; "
                         "it is never replaced by one") from None
    return report


def write_report(path: Path, text: str) -> None:
    """Write the report ``text`` at ``path`` (checked by :func:`check_report_path`) in one step."""
    from dql_pass.files import atomic_path

    with atomic_path(path, "report") as temporary:
        Path(temporary).write_text(text)


def _check_not_data_of(path: str, report: Path, files: Mapping[str, str]) -> None:
    """Refuse an existing report path that is an external data file of one of the command's models,
    whatever its bytes look like (read only when the path exists: a new file is no one's data)."""
    from dql_pass.files import external_tensors, read_model

    for what, file in files.items():
        try:  # what the model refers to, as read: its data is protected whether or not the checker accepts it
            tensors = external_tensors(read_model(file))
        except Exception:
            continue  # not a model (an array, an output not written yet)
        if any(_same_file(tensor.path, report) for tensor in tensors):
            raise InputError(f"{path}: the report would overwrite the external data of {what}; choose another path")


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False

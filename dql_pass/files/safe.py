"""Safe writing, whatever is written: the output-path policy, atomic small files, folder locks,
signals held back, stage folders, the one-step exchange and the sweep of what earlier writes left.

Nothing here knows a model's format: :mod:`dql_pass.files.models` builds the model save on this, and
:mod:`dql_pass.files.references` tells the sweep which data files a folder's models refer to. A write
stages its output in a folder beside the target, named as :func:`sweep` expects, and puts it in
place under the lock of the target's folder.
"""

from __future__ import annotations

__all__ = [
    "FolderLock", "atomic_path", "check_not_system", "check_output_path", "data_file_name", "default_file_mode",
    "directory_entry", "entries_of", "fsync", "is_data_file", "put_folder", "signals_deferred", "stale_data", "staged",
    "sweep", "tidy_up",
]

import contextlib
import ctypes
import errno
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dql_pass.errors import InputError, one_line
from dql_pass.files.references import referred_to, system_file
from dql_pass.interrupts import SIGNALS

try:
    import fcntl
except ImportError:  # not on Windows: writes there are atomic but not locked against each other
    fcntl = None

logger = logging.getLogger(__name__)


def check_not_system(path: str | os.PathLike, what: str = "output") -> None:
    """Refuse ``path`` if it, or any link on the way from it to its target, lies in /proc or /dev.

    A link is followed one step at a time, since the kernel's links there (``/proc/self/fd/1``)
    name the file they stand for: the whole chain must stay out of those folders.
    """
    current = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's limit on links in a row
        place = Path(os.path.realpath(current.parent)) / current.name
        if system_file(place):
            where = current if system_file(current) else place  # the name as the link spells it
            shown = "is" if where == Path(os.path.abspath(path)) else f"leads to {where}, which is"
            raise InputError(f"{path}: {shown} in /dev or /proc, the system's own files; it is never replaced")
        try:
            target = os.readlink(place)
        except OSError:  # not a link, or nothing there
            return
        current = Path(os.path.abspath(place.parent / target))
    raise InputError(f"{path}: too many links in a row; give the {what} path itself")


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """The output ``path``, refused unless it names a file we may replace.

    An existing output must be a regular file or a symbolic link (the link itself is replaced,
    never its target); a device, FIFO or socket is never replaced, since as root ``-o /dev/null``
    would destroy it for the whole machine, and nothing in /dev or /proc is, nor a link that
    leads there (see :func:`check_not_system`).
    """
    text = os.fspath(path)
    if not text:
        raise InputError(f"the {what} path is empty")
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.name in ("", ".", ".."):
        raise InputError(f"{text}: is a folder; give a file name for the {what}")
    check_not_system(path, what)
    if not path.parent.is_dir():
        raise InputError(f"{path}: the {what} folder does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as error:
        raise InputError(f"{path}: cannot write the {what}: {error.strerror}") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a folder; give a file name for the {what}")
    if stat.S_ISLNK(mode):
        # /dev/stdout and /dev/fd/N are links: replacing one would break the machine as /dev/null would.
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode  # a dangling link, or a link to a regular file, is replaced
        if stat.S_ISDIR(mode):
            raise InputError(f"{path}: links to a folder; give a file name for the {what}")
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise InputError(f"{path}: links to a device, FIFO or socket; it is never replaced")
    elif not stat.S_ISREG(mode):
        raise InputError(f"{path}: exists and is not a regular file (a device, FIFO or socket); it is never replaced")
    return path


def directory_entry(path: Path) -> Path:
    """The directory entry ``path`` names: its folder resolved, its last part kept even if a link."""
    return path.parent.resolve() / path.name


def entries_of(folder: Path, paths: Iterable[Path]) -> set[Path]:
    """The ``paths`` whose folder is ``folder`` itself, however reached (a bind mount, another link
    above it), as ``folder / name``: replacing that name there replaces them."""
    try:
        here = os.stat(folder)
    except OSError:
        return set()
    found = set()
    for path in paths:
        with contextlib.suppress(OSError):  # a folder gone since: nothing of it here
            there = os.stat(path.parent)
            if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
                found.add(folder / path.name)
    return found


def _read_umask() -> int:
    # /proc says it without changing it; os.umask would leave other threads a window with umask 0.
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def default_file_mode(folder: bool = False) -> int:
    """The permission bits a new file (or folder) gets under the process's umask."""
    return (0o777 if folder else 0o666) & ~_read_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "output") -> Iterator[str]:
    """Yield a temporary path beside ``path`` that replaces ``path`` once the block succeeds.

    On any failure or interruption the temporary file is removed and ``path`` is left as it was;
    what a kill -9 left, the next write of ``path`` removes (see :func:`sweep`). The temporary
    file is made and locked under the folder lock, so that no sweep removes it in flight.
    Only an ``OSError`` becomes :class:`InputError`: anything else is a bug, and surfaces as one.
    """
    path = check_output_path(path, what)
    folder = directory_entry(path).parent
    handle = None
    temporary = folder / _temporary_name(path.name)
    try:
        with FolderLock(folder), signals_deferred():
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_EX)
            else:  # Windows: no lock, and an open file cannot be renamed there
                os.close(handle)
                handle = None
    except OSError as error:
        if handle is not None:
            os.close(handle)
            os.unlink(temporary)
        raise InputError(f"{path}: cannot write the {what}: {error.strerror}") from None
    try:
        yield os.fspath(temporary)
        os.chmod(temporary, default_file_mode())
        with FolderLock(folder):
            stale = stale_data(folder, path.name, set())
            with signals_deferred():  # once in place, the write stands: its sweep goes with it
                os.replace(temporary, path)
                tidy_up(folder, path.name, set(), stale)
    except OSError as error:
        raise InputError(f"{path}: cannot write the {what}: {one_line(error)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if handle is not None:
            os.close(handle)


def _stem(name: str) -> str:
    """What the files named after output ``name`` start with: ``name``, or for a name so long that
    ours would pass the 255-byte limit of a file name, a cut of it with a digest of the whole."""
    if len(name.encode()) <= 200:
        return name
    return name.encode()[:160].decode(errors="ignore") + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


# The names of what a write of OUTPUT leaves beside it, made here and matched by the sweep alone:
# its data file OUTPUT.<12 hex>.data, a fresh name for every write, so that a model is never renamed
# next to data that is not its own; its stage folders .OUTPUT.<random>.stage; and the temporary
# files of atomic_path, .OUTPUT.<8 hex>.tmp.
_DATA = re.compile(r"(.+)\.[0-9a-f]{12}\.data")
_STAGE = ".stage"
_TEMPORARY = ".tmp"


def data_file_name(name: str) -> str:
    """A fresh name for the data file of output ``name``."""
    return f"{_stem(name)}.{secrets.token_hex(6)}.data"


def is_data_file(name: str) -> bool:
    """Whether ``name`` is the data file of an output, which the next write of that output removes."""
    return _DATA.fullmatch(name) is not None


def _data_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(_stem(name))}\.[0-9a-f]{{12}}\.data")


def _stage_prefix(name: str) -> str:
    return f".{_stem(name)}."


def _stage_pattern(name: str) -> re.Pattern[str]:
    # mkdtemp's own random part, 8 of [a-z0-9_]: no wider, since the sweep removes a stage whole, with what it holds.
    return re.compile(rf"{re.escape(_stage_prefix(name))}[a-z0-9_]{{8}}{re.escape(_STAGE)}")


def _temporary_name(name: str) -> str:
    return f"{_stage_prefix(name)}{secrets.token_hex(4)}{_TEMPORARY}"


def _temporary_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(_stage_prefix(name))}[0-9a-f]{{8}}{re.escape(_TEMPORARY)}")


class FolderLock:
    """An advisory lock (flock) on a folder, or with ``folder=False`` a file; the kernel drops it
    when the process dies."""

    def __init__(self, path: Path, *, block: bool = True, folder: bool = True) -> None:
        kind = getattr(os, "O_DIRECTORY", 0) if folder else 0
        self.fd = os.open(path, os.O_RDONLY | kind | getattr(os, "O_NOFOLLOW", 0))
        if fcntl is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(self.fd)
                raise

    def release(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back the signals that stop a command (:data:`~dql_pass.interrupts.SIGNALS`) for a step
    and the bookkeeping that must go with it; one the process ignores stays ignored.

    Blocking the signals in this thread would not do: the system hands a signal to any thread that
    does not block it (numpy's and ORT's threads too), and Python then runs the handler here at
    once. So the handlers are swapped for one that notes the signal, raised again after the step.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
                for sig in SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if held:
            signal.raise_signal(held[0])


def fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder and so the renames in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged(folder: Path, name: str, *, mode: int | None = None) -> Iterator[Path]:
    """A new stage folder for output ``name`` in ``folder``, locked while in use and removed on the
    way out whatever happens; ``mode`` for its permissions, where it becomes the output itself.

    It is made and locked under the folder lock, so that no :func:`sweep` sees it unlocked.
    """
    stage = stage_lock = None
    try:
        with FolderLock(folder), signals_deferred():  # else Ctrl-C could land between mkdtemp and the lock
            stage = Path(tempfile.mkdtemp(prefix=_stage_prefix(name), suffix=_STAGE, dir=folder))
            stage_lock = FolderLock(stage)
            if mode is not None:
                os.chmod(stage, mode)  # mkdtemp's 0700 would become the output's
        yield stage
    finally:
        with signals_deferred():  # a second Ctrl-C while a large stage goes would leave the rest of it
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            if stage_lock is not None:
                stage_lock.release()


# renameat2(2): both paths relative to the current folder, and swapped rather than moved.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """The C library's renameat2, or None where there is none (before glibc 2.28, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


def exchange(a: Path, b: Path) -> bool:
    """Swap the existing entries ``a`` and ``b`` in one step; False where the system or the file system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a kernel or file system without the exchange
        return False
    raise OSError(error, os.strerror(error), os.fspath(a), None, os.fspath(b))


def put_folder(stage: Path, target: Path) -> None:
    """Move the folder ``stage`` to ``target``, in one step as seen from ``target``; an existing
    ``target`` ends up at ``stage``, for the caller to remove.

    Where the system cannot swap in one step it takes two renames with the signals held
    back, the first undone if the second fails: only a kill -9 between them leaves nothing at
    ``target``, and the old folder under a stage name that the next sweep removes.
    """
    if not target.exists():
        os.rename(stage, target)
        return
    if exchange(stage, target):
        return
    old = target.with_name(f"{_stage_prefix(target.name)}{secrets.token_hex(4)}{_STAGE}")
    with signals_deferred():
        os.rename(target, old)
        try:
            os.rename(stage, target)
        except BaseException:
            os.rename(old, target)
            raise
        with contextlib.suppress(OSError):  # else the sweep removes it
            os.rename(old, stage)


def tidy_up(folder: Path, name: str, keep: set[Path], stale: set[Path]) -> None:
    """Once output ``name`` is in place, under the folder lock: flush its rename to the disk, then
    :func:`sweep`. A failure here is logged, not raised: the new output is in place already."""
    try:
        fsync(folder)
        sweep(folder, name, keep, stale)
    except OSError as error:
        logger.warning("%s: written, but not tidied up: %s", folder / name, one_line(error))


def stale_data(folder: Path, name: str, keep: set[Path]) -> set[Path]:
    """The data files that earlier writes of output ``name`` left in ``folder`` and that no file there may
    refer to, under the folder lock, before the new output goes in place: reading every file of the
    folder may take long, removes nothing, and an interrupt there still undoes the write.

    A data file is kept if it is in ``keep`` (the input's files and the new model's), or if another
    file of the folder may refer to it (:func:`~dql_pass.files.references.referred_to`): a model that
    survives keeps its data, whoever wrote it; the model at ``name``, being replaced, does not.
    """
    data = _data_pattern(name)
    keep = entries_of(folder, keep)
    entries = list(os.scandir(folder))
    unused = {folder / e.name for e in entries if data.fullmatch(e.name) and e.is_file(follow_symlinks=False)} - keep
    return unused - referred_to(folder, entries, unused, skip=keep | {folder / name})


def sweep(folder: Path, name: str, keep: set[Path], stale: set[Path]) -> None:
    """Remove what earlier writes of ``name`` left: the ``stale`` data files (:func:`stale_data`),
    stage folders and :func:`atomic_path`'s temporary files.

    Runs under the folder lock, which every writer holds from moving its data in to renaming its
    model. A stage folder or temporary file that its writer still holds locked is in flight, and kept.
    Links are never ours.
    """
    stage, temporary = _stage_pattern(name), _temporary_pattern(name)
    keep = entries_of(folder, keep)
    for entry in list(os.scandir(folder)):
        path = folder / entry.name
        try:
            if path in stale:
                os.unlink(path)
            elif path in keep:
                continue
            elif stage.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                with FolderLock(path, block=False):
                    shutil.rmtree(path)
            elif temporary.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with FolderLock(path, block=False, folder=False):
                    os.unlink(path)
            else:
                continue
            logger.info("removed %s, left by an earlier write", path)
        except BlockingIOError:
            continue
        except OSError as error:
            logger.warning("cannot remove %s: %s", path, error.strerror)

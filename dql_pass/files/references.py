"""Which data files the other files of a folder may refer to, for the sweep: a model names its data
file in its bytes, in any form onnx loads (binary protobuf, textproto, JSON, onnxtxt), whatever the
file's extension.

Rules: a file is read, never parsed as a model, and only as far as it may be a model; a name counts
in every spelling a text format may give it (escapes, strings joined), so that a false "refers to
it" keeps a file and nothing a model needs is removed; a file that cannot be read keeps them all.
"""

from __future__ import annotations

__all__ = ["referred_to", "system_file"]

import codecs
import collections
import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

# The system's own folders: what is there stands for a device or a process (/dev/stdout,
# /proc/self/fd/1), whatever it looks like. /dev/shm is a plain tmpfs for files.
_SYSTEM_FOLDERS = (Path("/proc"), Path("/dev"))
_FILE_FOLDERS = (Path("/dev/shm"),)


def _within(path: Path, folders: tuple[Path, ...]) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


def system_file(path: Path) -> bool:
    """Whether ``path`` (absolute) lies in /proc or /dev, outside /dev/shm: never a model, never an output."""
    return _within(path, _SYSTEM_FOLDERS) and not _within(path, _FILE_FOLDERS)


def referred_to(folder: Path, entries: list[os.DirEntry], candidates: set[Path], skip: set[Path]) -> set[Path]:
    """The ``candidates`` that a file of ``folder`` outside ``skip`` may refer to.

    A model names its data file in its bytes, so a file that holds a candidate's name in a form
    onnx reads (binary, or a string of one of its text formats, whatever the file's extension) may
    be a model that needs it (a copy of an older output, say, or a link to one elsewhere, which reads
    its data beside the link), and a link that leads to one may be the name a model uses. A file
    that cannot be read keeps them all. Models in other folders are not looked for: ONNX allows no
    ``..`` in a location, and a copy of an output made elsewhere looks for its data there, beside it.
    """
    found: set[Path] = set()
    names = {os.fsencode(path.name): path for path in candidates}
    for entry in entries:
        path = folder / entry.name
        if not names or path in candidates or path in skip:
            continue
        try:
            if entry.is_symlink():
                target = Path(os.path.realpath(path))
                if target in candidates:
                    found.add(target)
                    names.pop(os.fsencode(target.name), None)
                    continue
                if system_file(target):
                    continue
            # A linked model reads its data beside the link, here: it is read as a file of the folder.
            # A link that leads nowhere (dangling, a loop) is no model.
            try:
                if not entry.is_file():
                    continue
            except OSError:
                continue
            with open(path, "rb") as file:
                if _may_be_model(file):
                    file.seek(0)
                    found |= {names.pop(key) for key in _mentioned(file, set(names))}
                file.seek(0)
                found |= {names.pop(key) for key in _quoted(file, set(names))}
        except OSError as error:
            logger.warning("cannot read %s, so the data files of earlier writes are kept: %s", path, error.strerror)
            return set(candidates)
    return found


# onnx's text formats, each by how its strings are written: textproto (protobuf's tokenizer) and
# JSON take '...' or "..." within a line, a backslash taking the next character; onnxtxt (onnx's
# parser) takes "..." over lines too. A # outside a string starts a comment to the end of the line
# (in JSON it is an error: that file is no JSON). A control character outside a string or a
# comment rules a format out, and bytes that are not UTF-8 rule out all three (each decodes the
# file as UTF-8 first): a weights file is ruled out within a few bytes, whatever its name.
_TEXT_RULES = ((b"\"'", False), (b'"', True))
_CONTROL = rb"\x00-\x08\x0e-\x1f"
_NOT_CONTROL = bytes(byte for byte in range(256) if not re.fullmatch(b"[" + _CONTROL + b"]", bytes([byte])))
_STRING_LIMIT = 1 << 16  # bytes: a location is a path (under 4 KiB), each byte at most 10 bytes of escapes


class _Strings:
    """The strings of one text format in a file fed to it block by block, each in every spelling
    it may stand for (:meth:`_decoded`); ``dead`` once the file cannot be in that format."""

    def __init__(self, quotes: bytes, multiline: bool) -> None:
        self._outside = re.compile(b"[^" + re.escape(quotes) + rb"#" + _CONTROL + rb"]*")
        self._specials = [bytes([byte]) for byte in quotes + b"#"]
        # Plain bytes, then escapes each followed by plain bytes: unrolled, so that re runs through a
        # string of megabytes (a tensor's bytes) at once rather than one alternative per byte.
        def body(quote: int) -> re.Pattern[bytes]:
            plain = rb"[^" + re.escape(bytes([quote])) + rb"\\" + (b"" if multiline else rb"\n") + rb"]*"
            return re.compile(plain + rb"(?:" + (rb"\\[\s\S]" if multiline else rb"\\.") + plain + rb")*")

        self._bodies = {quote: body(quote) for quote in quotes}
        self._multiline = multiline
        self.dead = False
        self._state: int | None = None  # the open quote, or "#" in a comment; None between strings
        self._pieces: list[bytes] | None = []  # of the open string; None once too long to be a location
        self._carry = b""

    def feed(self, block: bytes, spelt: list[list[bytes]]) -> None:
        """Read ``block``; each string closed in it goes to ``spelt``, one list per spelling."""
        buffer, position = self._carry + block, 0
        self._carry = b""
        next_at: dict[bytes, int] = {}
        while position < len(buffer) and not self.dead:
            if self._state is None:
                position = self._outside_end(buffer, position, next_at)
                if position == len(buffer):
                    break
                byte = buffer[position]
                if byte not in self._bodies and byte != ord("#"):
                    self.dead = True  # a control character outside a string
                    break
                self._state, self._pieces, position = byte, [], position + 1
            elif self._state == ord("#"):
                end = buffer.find(b"\n", position)
                if end < 0:
                    break
                self._state, position = None, end + 1
            else:
                start = position
                if self._pieces is None:
                    position = self._skip(buffer, position)
                else:
                    # At most a location's length at once: past it, the string is skipped (_skip).
                    end = min(len(buffer), position + _STRING_LIMIT + 2)
                    position = self._bodies[self._state].match(buffer, position, end).end()
                    self._add(buffer[start:position])
                    if self._pieces is None:
                        continue
                if position == len(buffer) or (position == len(buffer) - 1 and buffer[position] == ord("\\")):
                    self._carry = buffer[position:]  # a backslash whose character comes in the next block
                    break
                if buffer[position] == self._state:
                    if self._pieces is not None:
                        raw = b"".join(self._pieces)
                        texts = self._decoded(raw, self._state) if b"\\" in raw else [raw] * 3
                        for spelling, text in zip(spelt, texts):
                            spelling.append(text)
                    position += 1
                self._state = None  # closed; or a line ended it unclosed, so that line was a comment

    def _outside_end(self, buffer: bytes, position: int, next_at: dict[bytes, int]) -> int:
        """Where the text outside strings and comments from ``position`` ends: at the next quote or
        #, or a control character before it. Found with find and translate, which run through
        megabytes (a tensor's numbers) at once where a regex takes a byte at a time; ``next_at``
        holds where each quote or # comes next in ``buffer``, so that no find runs twice."""
        for special in self._specials:
            if next_at.get(special, -1) < position:
                found = buffer.find(special, position)
                next_at[special] = len(buffer) if found < 0 else found
        stop = min(next_at.values())
        if buffer[position:stop].translate(None, _NOT_CONTROL):  # rare: the file is not in this format
            return self._outside.match(buffer, position, stop).end()
        return stop

    def _skip(self, buffer: bytes, position: int) -> int:
        """Where the open string, too long to matter (a tensor's bytes), ends in ``buffer``: at its
        closing quote, a line's end (one-line formats), or the buffer's end, less a backslash whose
        character comes in the next block. Found by searching for quotes, not a byte at a time."""
        limit = len(buffer) if self._multiline or (newline := buffer.find(b"\n", position)) < 0 else newline
        quote = bytes([self._state])
        while (found := buffer.find(quote, position, limit)) >= 0:
            run = found
            while run > position and buffer[run - 1] == ord("\\"):
                run -= 1
            if (found - run) % 2 == 0:  # not escaped
                return found
            position = found + 1
        if limit < len(buffer):
            return limit
        run = len(buffer)
        while run > position and buffer[run - 1] == ord("\\"):
            run -= 1
        return len(buffer) - (len(buffer) - run) % 2

    def _add(self, piece: bytes) -> None:
        if self._pieces is not None:
            self._pieces.append(piece)
            if sum(map(len, self._pieces)) > _STRING_LIMIT:
                self._pieces = None

    def _decoded(self, raw: bytes, quote: int) -> list[bytes]:
        """What the string ``raw`` may stand for, always in the same order: its bytes as written,
        then unescaped as onnxtxt does (a backslash takes the next character), or as textproto (C
        escapes) and JSON do; a string a format cannot read stays as written there."""
        from google.protobuf import text_encoding

        if self._multiline:
            return [raw, re.sub(rb"\\([\s\S])", rb"\1", raw)]
        spellings = [raw, raw, raw]
        with contextlib.suppress(Exception):  # not a string of textproto: the file is none
            spellings[1] = text_encoding.CUnescape(raw.decode())
        if quote == ord('"'):
            with contextlib.suppress(Exception):
                spellings[2] = json.loads(b'"' + raw + b'"').encode("utf-8", "surrogatepass")
        return spellings


def _may_be_model(file: BinaryIO) -> bool:
    """Whether ``file`` parses as protobuf fields to its end, as a ModelProto must: a weights file
    fails within a few fields, so it is not read through."""
    size = os.fstat(file.fileno()).st_size
    for _ in range(100_000):  # a model has few top-level fields; past that, read it through
        if file.tell() == size:
            return True
        tag = _varint(file)
        if tag is None or tag >> 3 == 0:
            return False
        wire = tag & 7
        if wire == 0:
            if _varint(file) is None:
                return False
        elif wire == 2:
            length = _varint(file)
            if length is None:
                return False
            file.seek(length, os.SEEK_CUR)
        elif wire in (1, 5):
            file.seek(8 if wire == 1 else 4, os.SEEK_CUR)
        else:
            return False
        if file.tell() > size:
            return False
    return True


def _varint(file: BinaryIO) -> int | None:
    value = shift = 0
    while shift < 64 and (byte := file.read(1)):
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    return None


def _mentioned(file: BinaryIO, keys: set[bytes], block: int = 1 << 24) -> set[bytes]:
    """The ``keys`` that occur in ``file``, read a block at a time."""
    found: set[bytes] = set()
    overlap = max(map(len, keys), default=1) - 1
    tail = b""
    while keys - found and (chunk := file.read(block)):
        window = tail + chunk
        found |= {key for key in keys - found if key in window}
        tail = window[len(window) - overlap:]
    return found


def _quoted(file: BinaryIO, keys: set[bytes], block: int = 1 << 24) -> set[bytes]:
    """The ``keys`` that the strings of ``file`` hold in any of onnx's text formats, alone or
    joined to the strings before them (protobuf's text format reads "a" "b" as "ab")."""
    formats = [_Strings(quotes, multiline) for quotes, multiline in _TEXT_RULES]
    tails: dict[tuple[int, int], bytes] = collections.defaultdict(bytes)  # by format and spelling, across blocks
    utf8 = codecs.getincrementaldecoder("utf-8")()
    found: set[bytes] = set()
    overlap = max(map(len, keys), default=1) - 1
    size = 1 << 16  # a first block that rules most files out, then blocks of ``block``
    while keys - found and not all(strings.dead for strings in formats) and (chunk := file.read(size)):
        size = block
        try:
            utf8.decode(chunk)
        except UnicodeDecodeError:
            break  # no text format: each reads the file as UTF-8
        for index, strings in enumerate(formats):
            spelt: list[list[bytes]] = [[], [], []]
            strings.feed(chunk, spelt)
            for spelling, texts in enumerate(spelt):
                window = tails[index, spelling] + b"".join(texts)
                found |= {key for key in keys - found if key in window}
                tails[index, spelling] = window[len(window) - overlap:]
    return found

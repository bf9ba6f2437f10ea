"""An export read safely: a single file, a folder or a zip, as a list of members to read.

Nothing is extracted to disk: a member is read as a stream, and every byte read counts against
one budget (IMPORT_MAX_BYTES), whatever the headers claim. Refused before anything is read (so
before anything is written): a file or archive larger than the budget; an archive with too many
members, a member whose path is absolute or climbs out with `..`, a symbolic link, an encrypted
member, or one that inflates more than MAX_RATIO times (a zip bomb); in a folder, a symbolic link.
"""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from recall.importing.errors import ImportRefused, TooLarge

MAX_MEMBERS = 100_000  # a Claude Code projects folder holds thousands of sessions, not millions
# Chat JSON deflates 5 to 20 times; a deflate bomb inflates about a thousand times.
MAX_RATIO = 200
RATIO_FLOOR = 1024 * 1024  # below this a member's ratio says nothing (tiny, repetitive files)
CHUNK = 64 * 1024


@dataclass
class Budget:
    """The bytes every member read from one export may add up to."""

    limit: int
    used: int = 0

    def spend(self, count: int, where: str) -> None:
        self.used += count
        if self.used > self.limit:
            raise TooLarge(f"{where}: the export holds more than IMPORT_MAX_BYTES ({self.limit})")


class BoundedReader:
    """A member's stream whose reads count against the budget."""

    def __init__(self, stream: BinaryIO, budget: Budget, name: str) -> None:
        self.stream, self.budget, self.name = stream, budget, name
        self.count = 0  # bytes read from this member

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(CHUNK if size is None or size < 0 else size)
        self.count += len(data)
        self.budget.spend(len(data), self.name)
        return data

    def lines(self) -> Iterator[bytes]:
        """The stream's lines without their newline, read a chunk at a time."""
        parts: list[bytes] = []
        while chunk := self.read(CHUNK):
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                parts.append(chunk[start:end])
                yield b"".join(parts)
                parts, start = [], end + 1
            parts.append(chunk[start:])
        if tail := b"".join(parts):
            yield tail


@dataclass(frozen=True)
class Member:
    name: str  # its path inside the export, with "/"
    size: int  # as declared (a zip's header) or found (a file)
    opener: Callable[[], BinaryIO] = field(repr=False)


@contextmanager
def open_export(
    path: Path, max_bytes: int, wanted: Callable[[str], bool]
) -> Iterator[tuple[list[Member], Budget]]:
    """The members ``wanted`` picks (a single file is always picked) and the budget their reads
    share; ImportRefused (nothing read yet) when the export is hostile or too large."""
    budget = Budget(max_bytes)
    if path.is_symlink():
        raise ImportRefused(f"{path.name}: a symbolic link; give the file itself")
    if path.is_dir():
        yield _folder_members(path, max_bytes, wanted), budget
        return
    if not path.is_file():
        raise ImportRefused(f"{path.name}: not a file or a folder")
    size = path.stat().st_size
    if size > max_bytes:
        raise TooLarge(f"{path.name}: {size} bytes, more than IMPORT_MAX_BYTES ({max_bytes})")
    if not zipfile.is_zipfile(path):
        yield [Member(path.name, size, lambda: open(path, "rb"))], budget  # noqa: SIM115
        return
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ImportRefused(f"{path.name}: not a readable zip archive ({exc})") from exc
    with archive:
        yield _zip_members(archive, path.name, max_bytes, wanted), budget


def _zip_members(
    archive: zipfile.ZipFile, label: str, max_bytes: int, wanted: Callable[[str], bool]
) -> list[Member]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise TooLarge(f"{label}: more than {MAX_MEMBERS} members in the archive")
    members, total = [], 0
    for info in infos:
        check_member(info)
        if info.is_dir() or not wanted(info.filename):
            continue
        total += info.file_size
        if total > max_bytes:
            raise TooLarge(
                f"{label}: its chats inflate to more than IMPORT_MAX_BYTES ({max_bytes})"
            )
        members.append(Member(info.filename, info.file_size, _zip_opener(archive, info)))
    return sorted(members, key=lambda m: m.name)


def _zip_opener(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], BinaryIO]:
    return lambda: archive.open(info)  # type: ignore[return-value]


def check_member(info: zipfile.ZipInfo) -> None:
    """ImportRefused when a member's path, kind or ratio is hostile."""
    name = info.filename
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise ImportRefused(f"{name}: a path that climbs out of the archive")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ImportRefused(f"{name}: a symbolic link in the archive")
    if info.flag_bits & 0x1:
        raise ImportRefused(f"{name}: an encrypted member; export it again without a password")
    packed = max(info.compress_size, 1)
    if info.file_size > RATIO_FLOOR and info.file_size / packed > MAX_RATIO:
        raise TooLarge(
            f"{name}: inflates {info.file_size // packed} times (more than {MAX_RATIO}): a zip bomb"
        )


def _folder_members(root: Path, max_bytes: int, wanted: Callable[[str], bool]) -> list[Member]:
    members, total, seen = [], 0, 0
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            full = Path(folder) / name
            relative = PurePosixPath(full.relative_to(root)).as_posix()
            if full.is_symlink():
                raise ImportRefused(f"{relative}: a symbolic link in the folder")
            seen += 1
            if seen > MAX_MEMBERS:
                raise TooLarge(f"{root.name}: more than {MAX_MEMBERS} files in the folder")
            if name in files and wanted(relative):
                size = full.stat().st_size
                total += size
                if total > max_bytes:
                    raise TooLarge(f"{root.name}: more than IMPORT_MAX_BYTES ({max_bytes})")
                members.append(Member(relative, size, _file_opener(full)))
    return sorted(members, key=lambda m: m.name)


def _file_opener(path: Path) -> Callable[[], BinaryIO]:
    return lambda: open(path, "rb")

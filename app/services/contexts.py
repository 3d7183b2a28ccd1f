"""Code contexts: a user's project as a .tar.gz or .zip, stored by content hash, unpacked for runs.

An upload is checked before it is stored, and unpacked only by a worker (never imported here):

- size: the archive at most ``max_upload_bytes``, its members together at most
  ``max_context_bytes`` unpacked, at most ``MAX_MEMBERS`` of them. The check reads member by
  member through a bounded decompressing reader and stops at the first member that crosses a
  limit (413 naming it): a small archive that unpacks to gigabytes costs its first headers, not
  its gigabytes; the API runs it in its thread pool, off the event loop;
- names: no absolute path, no ``..``, no link of any kind, no device or FIFO: regular files and
  folders only (a zip member with permission bits but no file-type bits, as ``zipfile.writestr``
  writes, is a regular file). tar archives are unpacked with the standard library's ``data`` extraction filter
  (PEP 706), which enforces the same again; zip members are written one by one after the checks.

The archive is kept in the database (``contexts``), so workers on other hosts reach it through
the same database as the API; each unpacks it once into its own data folder.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.models import CodeContext
from pipeboard.app.services.errors import NotFound, ServiceError
from pipeboard.app.services.tx import begin_write

MAX_MEMBERS = 20_000


@dataclass(frozen=True)
class Member:
    name: str  # the archive's own spelling, checked
    size: int
    is_dir: bool


def _checked_name(name: str) -> str:
    """The member name, or 422 for one that could land outside the folder it unpacks into."""
    path = PurePosixPath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise ServiceError(f"file: archive member {name!r} has an absolute path", status=422, field="file")
    if ".." in path.parts:
        raise ServiceError(f"file: archive member {name!r} climbs out of the archive ('..')", status=422, field="file")
    return name


DAMAGED = "file: not a .tar.gz or .zip archive (or a damaged one)"
# What a tar stream may hold beyond its members' declared sizes: each member's header block(s),
# a long name's PAX record and its padding, and the end-of-archive blocks (GNU tar pads to 10 KiB).
HEADER_ALLOWANCE = 8 * 1024
END_ALLOWANCE = 64 * 1024


class _Unpacked(Exception):
    """The decompressed stream gave more bytes than the archive's members account for."""


class _BoundedReader(io.RawIOBase):
    """A decompressing stream that refuses to give more than ``limit`` bytes: a compressed bomb
    is stopped after ``limit`` bytes of work, not at its end. ``limit`` grows as members are read."""

    def __init__(self, stream, limit: int) -> None:
        self._stream = stream
        self.limit = limit
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        room = max(0, int(min(len(buffer), self.limit - self.total + 1)))  # one byte past the limit shows it
        n = self._stream.readinto(memoryview(buffer)[:room]) if room else 0
        self.total += n
        if self.total > self.limit:
            raise _Unpacked
        return n


def _decompressing(content: bytes):
    """The archive's bytes, decompressed as they are read (gzip, bzip2, xz or a plain tar)."""
    raw = io.BytesIO(content)
    if content[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if content[:3] == b"BZh":
        return bz2.BZ2File(raw, mode="rb")
    if content[:6] == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw, mode="rb")
    return raw


def list_members(content: bytes, max_unpacked: int | None = None) -> tuple[str, list[Member]]:
    """The archive's format ("tar.gz" or "zip") and its members, each checked; 422 naming the
    first that is refused, and 422 naming the file for one that is truncated or corrupt (a
    truncated gzip stream ends in EOFError, a corrupt one in zlib.error: never a 500).

    With ``max_unpacked``, 413 naming the first member whose size takes the total past it, read
    member by member: a bomb is refused at its first header that crosses the limit, and its
    decompressed bytes are never more than the members' declared sizes plus their headers."""
    try:
        if zipfile.is_zipfile(io.BytesIO(content)):
            return "zip", _zip_members(content, max_unpacked)
        return "tar.gz", _tar_members(content, max_unpacked)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError,
            NotImplementedError):
        raise ServiceError(DAMAGED, status=422, field="file") from None


def _past_limit(name: str, total: int, limit: int) -> ServiceError:
    return ServiceError(f"file: the archive unpacks to more than the limit of {limit} bytes (at member {name!r}, "
                        f"{total} bytes so far)", status=413, field="file")


def _zip_members(content: bytes, max_unpacked: int | None) -> list[Member]:
    members: list[Member] = []
    total = 0
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        infos = archive.infolist()
        for info in infos:
            kind = stat.S_IFMT(info.external_attr >> 16)
            # permission bits without file-type bits (zipfile.writestr's 0o600) are a plain file
            if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                raise _special_member(info.filename)
            members.append(Member(_checked_name(info.filename), info.file_size, info.is_dir()))
            if len(members) > MAX_MEMBERS:
                return members
            total += info.file_size
            if max_unpacked is not None and total > max_unpacked:
                raise _past_limit(info.filename, total, max_unpacked)
        if max_unpacked is not None:
            # Read each member through: zipfile stops a member at its declared size and checks its
            # CRC, so a lying or damaged member shows here, within the sizes just summed.
            for info in infos:
                if not info.is_dir():
                    with archive.open(info) as member:
                        while member.read(1 << 20):
                            pass
    return members


def _special_member(name: str) -> ServiceError:
    return ServiceError(f"file: archive member {name!r} is a link or special file; only files and folders are allowed",
                        status=422, field="file")


def _tar_members(content: bytes, max_unpacked: int | None) -> list[Member]:
    limit = max_unpacked if max_unpacked is not None else float("inf")
    stream = _BoundedReader(_decompressing(content), END_ALLOWANCE)
    members: list[Member] = []
    total, name = 0, "(the first)"
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for info in archive:
                name = info.name
                if not (info.isfile() or info.isdir()):
                    raise _special_member(info.name)
                members.append(Member(_checked_name(info.name), info.size, info.isdir()))
                if len(members) > MAX_MEMBERS:
                    return members
                total += info.size
                if total > limit:  # the header says so: refused before its bytes are decompressed
                    raise _past_limit(info.name, total, int(limit))
                stream.limit = total + HEADER_ALLOWANCE * len(members) + END_ALLOWANCE
            # to the compressed stream's end: a cut in the padding after the last member shows
            # there, and so does a bomb hidden after the end-of-archive blocks
            while stream.read(1 << 20):
                pass
    except _Unpacked:
        raise ServiceError(f"file: the archive unpacks to more than its members account for (stopped at "
                           f"{stream.total} bytes, after member {name!r}; limit {int(limit)} bytes)",
                           status=413, field="file") from None
    return members


def check_archive(content: bytes, *, max_bytes: int, max_unpacked: int) -> tuple[str, list[Member]]:
    """The archive's format and members, or the first limit it crosses (413) or member refused
    (422). Reads member by member and stops there: blocking work, so the API runs it in its
    thread pool (app/api/routes/contexts.py), never on the event loop."""
    if len(content) > max_bytes:
        raise ServiceError(f"file: archive of {len(content)} bytes exceeds the limit of {max_bytes} bytes",
                           status=413, field="file")
    if not content:
        raise ServiceError("file: the upload is empty", status=422, field="file")
    kind, members = list_members(content, max_unpacked)
    if len(members) > MAX_MEMBERS:
        raise ServiceError(f"file: more than {MAX_MEMBERS} members", status=422, field="file")
    if not any(not m.is_dir for m in members):
        raise ServiceError("file: the archive holds no files", status=422, field="file")
    return kind, members


def store(session: Session, content: bytes, filename: str, *, max_bytes: int, max_unpacked: int) -> tuple[CodeContext, bool]:
    """The stored context for these bytes (checked) and whether it is new; the same content
    uploaded twice is stored once."""
    kind, members = check_archive(content, max_bytes=max_bytes, max_unpacked=max_unpacked)
    digest = hashlib.sha256(content).hexdigest()
    row = session.get(CodeContext, digest)
    if row is not None:
        return row, False
    begin_write(session)
    row = CodeContext(sha256=digest, filename=(filename or "context")[:200], kind=kind, size=len(content),
                      files=sum(1 for m in members if not m.is_dir),
                      unpacked_bytes=sum(m.size for m in members), content=content)
    session.add(row)
    session.commit()
    return row, True


def get(session: Session, digest: str) -> CodeContext:
    row = session.get(CodeContext, digest)
    if row is None:
        raise NotFound("context", digest)
    return row


def unpack(session: Session, digest: str, data_dir: Path) -> Path:
    """The folder holding context ``digest`` unpacked under ``data_dir`` (unpacked once; a
    half-written folder is never used: it is written beside and renamed into place)."""
    target = Path(data_dir) / "contexts" / digest
    if target.is_dir():
        return target
    row = session.scalar(select(CodeContext).where(CodeContext.sha256 == digest))
    if row is None:
        raise NotFound("context", digest)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=target.parent))
    try:
        extract(bytes(row.content), scratch)
        try:
            os.rename(scratch, target)
        except OSError:  # another worker got there first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def extract(content: bytes, dest: Path) -> None:
    """Unpack a checked archive into ``dest`` (checked again: links, absolute paths and ``..``
    are refused whatever the caller did)."""
    kind, members = list_members(content)
    dest = Path(dest).resolve()
    if kind == "zip":
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            for info in archive.infolist():
                path = (dest / info.filename).resolve()
                if dest not in path.parents and path != dest:
                    raise ServiceError(f"file: archive member {info.filename!r} leaves the folder", status=422, field="file")
                if info.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out)
        return
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:*") as archive:
        archive.extractall(dest, filter="data")


def pack(folder: Path) -> bytes:
    """``folder`` as a .tar.gz whose bytes depend only on its files' names and contents (sorted,
    no times, owners or modes beyond executable), so the same project hashes the same.
    Skips ``__pycache__``, ``.git`` and virtual environments."""
    folder = Path(folder)
    skip = {"__pycache__", ".git", ".venv", "venv", ".mypy_cache", ".pytest_cache", "node_modules"}
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped:  # no time in the header either
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for root, dirs, files in os.walk(folder):
                dirs[:] = sorted(d for d in dirs if d not in skip and not os.path.islink(os.path.join(root, d)))
                for name in sorted(files):
                    path = Path(root) / name
                    if path.is_symlink() or not path.is_file() or name.endswith(".pyc"):
                        continue
                    rel = path.relative_to(folder).as_posix()
                    info = tarfile.TarInfo(rel)
                    info.size = path.stat().st_size
                    info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                    with open(path, "rb") as src:
                        archive.addfile(info, src)
    return buffer.getvalue()

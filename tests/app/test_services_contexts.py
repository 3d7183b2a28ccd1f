"""Code contexts: archives are checked before they are stored and unpacked only into their folder."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import os
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from pipeboard.app.services import contexts
from pipeboard.app.services.errors import ServiceError

LIMITS = {"max_bytes": 1 << 20, "max_unpacked": 1 << 20}


def tar_of(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def file_info(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def zip_of(entries: list[tuple[str, bytes, int | None]]) -> bytes:
    """(name, bytes, unix mode or None)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def refused(content: bytes, *words: str, status: int = 422) -> None:
    with pytest.raises(ServiceError) as caught:
        contexts.check_archive(content, **LIMITS)
    assert caught.value.status == status and caught.value.field == "file", caught.value.message
    for word in words:
        assert word in caught.value.message, caught.value.message


def test_a_project_tarball_and_zip_pass_and_list_their_files():
    tar = tar_of([(file_info("task.py"), b"x = 1\n"), (file_info("pkg/__init__.py"), b"")])
    assert contexts.check_archive(tar, **LIMITS)[0] == "tar.gz"
    kind, members = contexts.check_archive(zip_of([("task.py", b"x = 1\n", 0o100644), ("pkg/", b"", 0o40755)]), **LIMITS)
    assert kind == "zip" and [m.name for m in members if not m.is_dir] == ["task.py"]


@pytest.mark.parametrize("name", ["/etc/cron.d/x", "../outside.py", "pkg/../../outside.py", "C:\\evil.py"])
def test_absolute_and_climbing_names_are_refused(name):
    refused(tar_of([(file_info(name), b"x")]), repr(name))
    refused(zip_of([(name, b"x", 0o100644)]), repr(name))


def test_links_and_special_files_are_refused():
    symlink = file_info("link.py")
    symlink.type, symlink.linkname = tarfile.SYMTYPE, "/etc/passwd"
    refused(tar_of([(symlink, None)]), "link")
    hardlink = file_info("hard.py")
    hardlink.type, hardlink.linkname = tarfile.LNKTYPE, "task.py"
    refused(tar_of([(file_info("task.py"), b"x"), (hardlink, None)]), "link")
    fifo = file_info("pipe")
    fifo.type = tarfile.FIFOTYPE
    refused(tar_of([(fifo, None)]), "special")
    refused(zip_of([("link.py", b"/etc/passwd", 0o120777)]), "link")


def test_sizes_packed_and_unpacked_are_limited():
    big = b"\0" * (2 << 20)  # compresses to a few KB: a small archive that unpacks large
    archive = tar_of([(file_info("zeros.bin"), big)])
    assert len(archive) < LIMITS["max_bytes"]
    refused(archive, "unpacks to", status=413)
    with pytest.raises(ServiceError) as caught:
        contexts.check_archive(archive, max_bytes=100, max_unpacked=1 << 30)
    assert caught.value.status == 413 and "exceeds the limit" in caught.value.message
    refused(b"", "empty")
    refused(b"this is not an archive", "not a .tar.gz or .zip")
    refused(zip_of([("only/", b"", 0o40755)]), "no files")


def test_pack_depends_only_on_names_and_contents(tmp_path: Path):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "task.py").write_text("def make(): pass\n")
    (project / "pkg" / "__init__.py").write_text("")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"junk")
    first = contexts.pack(project)
    time.sleep(0.01)
    os.utime(project / "task.py", (1, 1))
    assert contexts.pack(project) == first  # times are not in the archive
    with tarfile.open(fileobj=io.BytesIO(first)) as archive:
        assert sorted(archive.getnames()) == ["pkg/__init__.py", "task.py"]  # no __pycache__
    (project / "task.py").write_text("def make(): return 1\n")
    assert hashlib.sha256(contexts.pack(project)).digest() != hashlib.sha256(first).digest()


def test_extract_round_trip_and_refuses_escapes_again(tmp_path: Path):
    content = tar_of([(file_info("task.py"), b"x = 1\n"), (file_info("pkg/mod.py"), b"y = 2\n")])
    contexts.extract(content, tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "mod.py").read_bytes() == b"y = 2\n"
    with pytest.raises(ServiceError):
        contexts.extract(zip_of([("../escaped.py", b"x", 0o100644)]), tmp_path / "out2")
    assert not (tmp_path / "escaped.py").exists()


def test_store_keeps_one_copy_per_content(session):
    content = tar_of([(file_info("task.py"), b"x = 1\n")])
    row, new = contexts.store(session, content, "p.tar.gz", **LIMITS)
    again, new_again = contexts.store(session, content, "other-name.tar.gz", **LIMITS)
    assert new and not new_again and again.sha256 == row.sha256 == hashlib.sha256(content).hexdigest()
    assert (row.files, row.kind) == (1, "tar.gz")


def compressed_tar(members: list[tuple[str, bytes]], *, compression: str, trailing: bytes = b"") -> bytes:
    """A tar of ``members`` (+ ``trailing`` bytes after its end-of-archive blocks), compressed."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue() + trailing
    return bz2.compress(raw) if compression == "bz2" else gzip.compress(raw)


@pytest.mark.parametrize("compression", ["bz2", "gz"])
def test_a_bomb_is_refused_at_the_member_that_crosses_the_limit(compression):
    limit = 1 << 20
    small = compressed_tar([("task.py", b"x = 1\n"), ("a.bin", b"\0" * (limit // 2)), ("b.bin", b"\0" * limit),
                            ("c.bin", b"\0" * limit)], compression=compression)
    with pytest.raises(ServiceError) as caught:
        contexts.check_archive(small, max_bytes=1 << 20, max_unpacked=limit)
    assert caught.value.status == 413 and "'b.bin'" in caught.value.message, caught.value.message


@pytest.mark.parametrize("compression", ["bz2", "gz"])
def test_bytes_hidden_after_the_archive_s_end_are_decompressed_only_up_to_what_the_members_account_for(compression):
    # 64 MiB of zeros after the end-of-archive blocks: no header declares them
    bomb = compressed_tar([("task.py", b"x = 1\n")], compression=compression, trailing=b"\0" * (64 << 20))
    with pytest.raises(ServiceError) as caught:
        contexts.check_archive(bomb, max_bytes=1 << 20, max_unpacked=1 << 30)
    assert caught.value.status == 413 and "'task.py'" in caught.value.message, caught.value.message
    stopped_at = int(caught.value.message.split("stopped at ")[1].split(" bytes")[0])
    assert stopped_at < 1 << 20  # the check read well under 1 MiB of the 64, not the whole stream


def test_a_zip_member_crossing_the_limit_is_named_and_a_lying_member_is_damaged():
    limit = 1 << 20
    entries = [("a.bin", b"\0" * (limit // 2), None), ("b.bin", b"\0" * limit, None)]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data, _ in entries:
            archive.writestr(name, data)
    with pytest.raises(ServiceError) as caught:
        contexts.check_archive(buffer.getvalue(), max_bytes=1 << 20, max_unpacked=limit)
    assert caught.value.status == 413 and "'b.bin'" in caught.value.message
    good = bytearray(zip_of([("task.py", b"x = 1\n" * 100, 0o100644)]))
    at = good.index(b"x = 1\n")
    good[at] = ord("y")  # the stored bytes no longer match the member's CRC
    refused(bytes(good), "damaged")


def test_a_zip_member_with_permission_bits_but_no_type_bits_is_a_regular_file():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("task.py", "x = 1\n")  # external_attr 0o600 << 16: no S_IFREG
        archive.writestr("pkg/__init__.py", "")
    assert (zipfile.ZipFile(io.BytesIO(buffer.getvalue())).getinfo("task.py").external_attr >> 16) == 0o600
    kind, members = contexts.check_archive(buffer.getvalue(), **LIMITS)
    assert kind == "zip" and sorted(m.name for m in members if not m.is_dir) == ["pkg/__init__.py", "task.py"]

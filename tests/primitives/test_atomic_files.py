"""Durable writes: content lands whole, no temp files linger, publishing never overwrites."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import orjson
import pytest

from turnkeep.primitives.atomic_files import (
    DamagedJsonl,
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    fsync_tree,
    is_staging_name,
    publish_dir,
    read_jsonl,
    remove_stale_staging,
    sha256_file,
    staging_dir,
)


def test_atomic_writes_replace_content_and_leave_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    atomic_write_text(tmp_path / "note.txt", "héllo")
    assert (tmp_path / "note.txt").read_text(encoding="utf-8") == "héllo"
    atomic_write_json(tmp_path / "m.json", {"b": 1, "a": [1, 2]})
    assert orjson.loads((tmp_path / "m.json").read_bytes()) == {"a": [1, 2], "b": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "note.txt", "state.bin"]


def test_failed_write_keeps_the_old_file_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"v": object()})
    with pytest.raises(TypeError):
        atomic_write_bytes(target, 123)  # type: ignore[arg-type]  # fails after the temp file exists
    assert orjson.loads(target.read_bytes()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_staging_names_never_look_published(tmp_path: Path) -> None:
    first = staging_dir(tmp_path / "snapshots", "step-10")
    second = staging_dir(tmp_path / "snapshots", "step-10")
    assert first != second
    assert first.name.startswith(".staging-step-10-") and first.is_dir()
    assert is_staging_name(first.name) and not is_staging_name("step-10")
    with pytest.raises(ValueError):
        staging_dir(tmp_path, "a/b")


def test_publish_moves_staging_into_place_and_refuses_an_existing_target(tmp_path: Path) -> None:
    staging = staging_dir(tmp_path, "snap")
    (staging / "sub").mkdir()
    (staging / "sub" / "rows.bin").write_bytes(b"rows")
    fsync_tree(staging)
    final = tmp_path / "snap"
    publish_dir(staging, final)
    assert (final / "sub" / "rows.bin").read_bytes() == b"rows"
    assert not staging.exists()

    again = staging_dir(tmp_path, "snap")
    with pytest.raises(FileExistsError, match="already exists"):
        publish_dir(again, final)
    assert again.is_dir()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileExistsError):
        publish_dir(again, tmp_path / "empty")


def test_remove_stale_staging_removes_only_unpublished_entries(tmp_path: Path) -> None:
    staging = staging_dir(tmp_path, "snap")
    (staging / "f").write_bytes(b"x")
    (tmp_path / ".tmp-m.json-abc").write_bytes(b"half")
    (tmp_path / "published").mkdir()
    removed = remove_stale_staging(tmp_path)
    assert {p.name for p in removed} == {staging.name, ".tmp-m.json-abc"}
    assert [p.name for p in tmp_path.iterdir()] == ["published"]
    assert remove_stale_staging(tmp_path / "missing") == []


def test_append_jsonl_and_read_skips_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    append_jsonl(log, {"i": 1}, durable=True)
    append_jsonl(log, {"i": 2})
    with open(log, "ab") as f:
        f.write(b'{"i": 3')  # a crash mid-append
    assert list(read_jsonl(log)) == [{"i": 1}, {"i": 2}]


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path, chunk_bytes=4096) == hashlib.sha256(data).hexdigest()


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "events.jsonl"
    append_jsonl(log, {"i": 1}, durable=True)
    before = log.read_bytes()
    real_write = os.write
    calls = []

    def full_disk(fd: int, data) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:4]))  # a short write: what fit
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError) as info:
        append_jsonl(log, {"i": 2, "pad": "x" * 40}, durable=True)
    assert info.value.errno == errno.ENOSPC
    assert log.read_bytes() == before  # the 4 bytes that fit were cut back
    monkeypatch.setattr(os, "write", real_write)
    append_jsonl(log, {"i": 3})
    assert list(read_jsonl(log)) == [{"i": 1}, {"i": 3}]


def test_read_jsonl_refuses_a_damaged_line_before_the_end(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b'{"i": 1}\n{"i": 2\n{"i": 3}\n')
    with pytest.raises(DamagedJsonl, match=r"events.jsonl line 2 \(byte 9\)"):
        list(read_jsonl(log))

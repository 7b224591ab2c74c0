"""A point folder moved as change sets (harness.store.transfer, the Ray backend's --transfer objects):
what travels, what a change set holds, the checkpoint whole, removals, merged change sets, and the
order in which the receiving side writes (logs, then checkpoint, then status)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.store.transfer import ChangeTracker, merge_changes, read_files, write_files


def folder(tmp_path: Path) -> Path:
    d = tmp_path / "p"
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "state.pt").write_bytes(b"\x00\x01weights")
    (d / "metrics.jsonl").write_text('{"update": 0}\n')
    (d / "status").write_text("running\n")
    (d / "adapter").mkdir()
    (d / "adapter" / "w.bin").write_bytes(b"w")
    (d / ".lock").write_text("")
    (d / ".metrics.jsonl.tmp123").write_text("half")
    (d / ".corrupt" / "t0").mkdir(parents=True)
    (d / ".corrupt" / "t0" / "status").write_text("bad")
    return d


def test_what_travels(tmp_path):
    files = read_files(folder(tmp_path))
    assert set(files) == {
        "checkpoint/state.pt",
        "metrics.jsonl",
        "status",
        "adapter/w.bin",
        ".corrupt/t0/status",
    }  # no lock, no temporary files
    assert files["checkpoint/state.pt"] == b"\x00\x01weights"


def test_a_copy_through_change_sets_is_byte_identical(tmp_path):
    src, dst = folder(tmp_path), tmp_path / "copy"
    tracker = ChangeTracker({})
    write_files(dst, tracker.changes(read_files(src)))
    assert tracker.changes(read_files(src)) == {}  # nothing changed since
    with open(src / "metrics.jsonl", "a") as f:
        f.write('{"update": 1}\n')
    (src / "checkpoint" / "extra.bin").write_bytes(b"e")
    (src / "adapter" / "w.bin").unlink()
    changes = tracker.changes(read_files(src))
    assert changes == {
        "metrics.jsonl": b'{"update": 0}\n{"update": 1}\n',
        "checkpoint/state.pt": b"\x00\x01weights",  # the checkpoint travels whole
        "checkpoint/extra.bin": b"e",
        "adapter/w.bin": None,
    }
    write_files(dst, changes)
    assert read_files(dst) == read_files(src)
    assert not (dst / ".checkpoint.tmp").exists() and not (dst / ".checkpoint.old").exists()


def test_a_new_checkpoint_replaces_the_old_one_whole(tmp_path):
    dst = tmp_path / "d"
    write_files(dst, {"checkpoint/a": b"1", "checkpoint/b": b"2"})
    held: dict = {"checkpoint/a": b"1", "checkpoint/b": b"2", "metrics.jsonl": b"x"}
    new = {"checkpoint/a": b"3"}
    merge_changes(held, new)
    assert held == {"checkpoint/a": b"3", "checkpoint/b": None, "metrics.jsonl": b"x"}
    write_files(dst, new)
    assert sorted(os.listdir(dst / "checkpoint")) == ["a"] and (dst / "checkpoint" / "a").read_bytes() == b"3"


def test_the_status_is_written_last_and_the_checkpoint_after_the_logs(tmp_path, monkeypatch):
    import harness.store.transfer as transfer

    order: list[str] = []
    real = transfer._write_bytes
    monkeypatch.setattr(transfer, "_write_bytes", lambda path, data: (order.append(path.name), real(path, data)))
    write_files(tmp_path / "d", {"status": b"done\n", "checkpoint/state.pt": b"c", "metrics.jsonl": b"m", "z": b"z"})
    assert order == ["metrics.jsonl", "z", "state.pt", "status"]

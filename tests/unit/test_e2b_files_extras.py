"""envd's file extras on a real folder: metadata kept as `user.e2b.*` attributes, and
what a watcher reports between two scans (`protocols/e2b/watch.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel_gateway.errors import BadRequest
from kernel_gateway.kernels.workspace import FileInfo, Workspace
from kernel_gateway.protocols.e2b.envd_entries import described
from kernel_gateway.protocols.e2b.watch import Watch


def write(
    workspace: Workspace, path: str, data: bytes, metadata: dict[str, str] | None = None
) -> FileInfo:
    upload = workspace.begin_upload(path, 1 << 20, metadata)
    upload.write(data)
    return upload.commit()


def metadata_of(workspace: Workspace, path: str) -> dict[str, str] | None:
    return workspace.metadata(workspace.entry(path))


def test_metadata_is_kept_shown_moved_and_dropped_by_an_overwrite(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    write(workspace, "a/notes.txt", b"x", {"author": "mish", "purpose": "upload"})
    assert metadata_of(workspace, "a/notes.txt") == {"author": "mish", "purpose": "upload"}
    assert os.getxattr(tmp_path / "a" / "notes.txt", "user.e2b.author") == b"mish"
    entry = described(workspace, workspace.entry("a/notes.txt"))
    assert entry["metadata"] == {"author": "mish", "purpose": "upload"}
    workspace.move("a/notes.txt", "b/renamed.txt")
    assert metadata_of(workspace, "b/renamed.txt") == {"author": "mish", "purpose": "upload"}
    write(workspace, "b/renamed.txt", b"again")
    assert metadata_of(workspace, "b/renamed.txt") is None
    assert "metadata" not in described(workspace, workspace.entry("b/renamed.txt"))


def test_attributes_set_by_the_code_are_metadata_and_others_are_not(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    write(workspace, "f", b"x")
    os.setxattr(tmp_path / "f", "user.e2b.author", b"code")
    os.setxattr(tmp_path / "f", "user.other", b"not ours")
    assert metadata_of(workspace, "f") == {"author": "code"}


def test_a_symlink_has_no_metadata_and_is_not_followed(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    write(workspace, "target", b"x", {"k": "v"})
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert metadata_of(workspace, "link") is None


@pytest.mark.parametrize(
    "metadata",
    [{"bad key": "v"}, {"": "v"}, {"k": "line\nbreak"}, {"k": "é"}, {"k": "v" * 4000}],
)
def test_bad_metadata_is_refused_and_nothing_written(
    tmp_path: Path, metadata: dict[str, str]
) -> None:
    workspace = Workspace(tmp_path)
    with pytest.raises(BadRequest):
        write(workspace, "f", b"x", metadata)
    assert list(tmp_path.iterdir()) == []


def names_and_types(watch: Watch, workspace: Workspace) -> list[tuple[str, str]]:
    return [(e["name"], e["type"].removeprefix("EVENT_TYPE_")) for e in watch.changes(workspace)]


def test_a_watch_reports_what_envd_would_in_its_order(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    (tmp_path / "d" / "old").mkdir(parents=True)
    write(workspace, "d/keep.txt", b"1")
    write(workspace, "d/gone.txt", b"1")
    write(workspace, "d/moving.txt", b"1")
    watch = Watch.start(workspace, "d", recursive=True, include_entry=False)
    assert watch.changes(workspace) == []
    write(workspace, "d/old/new.txt", b"content")
    write(workspace, "d/empty.txt", b"")
    (tmp_path / "d" / "sub").mkdir()
    found = names_and_types(watch, workspace)
    assert found == [
        ("empty.txt", "CREATE"),
        ("empty.txt", "CHMOD"),
        ("old/new.txt", "CREATE"),
        ("old/new.txt", "CHMOD"),
        ("old/new.txt", "WRITE"),
        ("sub", "CREATE"),
    ]
    (tmp_path / "d" / "keep.txt").write_bytes(b"changed")
    (tmp_path / "d" / "gone.txt").unlink()
    (tmp_path / "d" / "moving.txt").rename(tmp_path / "d" / "moved.txt")
    os.chmod(tmp_path / "d" / "sub", 0o700)
    assert names_and_types(watch, workspace) == [
        ("moving.txt", "RENAME"),
        ("moved.txt", "CREATE"),
        ("keep.txt", "WRITE"),
        ("sub", "CHMOD"),
        ("gone.txt", "REMOVE"),
    ]


def test_a_shallow_watch_sees_one_level_and_entries_when_asked(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    (tmp_path / "d" / "deep").mkdir(parents=True)
    watch = Watch.start(workspace, "d", recursive=False, include_entry=True)
    write(workspace, "d/deep/below.txt", b"x")
    write(workspace, "d/top.txt", b"x", {"tag": "t"})
    events = watch.changes(workspace)
    assert [e["name"] for e in events] == ["top.txt"] * 3
    entry = events[0]["entry"]
    assert entry["path"] == "/home/user/d/top.txt" and entry["type"] == "FILE_TYPE_FILE"
    assert entry["metadata"] == {"tag": "t"}
    os.unlink(tmp_path / "d" / "top.txt")
    assert watch.changes(workspace) == [{"name": "top.txt", "type": "EVENT_TYPE_REMOVE"}]


def test_an_upload_in_progress_is_not_reported(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    watch = Watch.start(workspace, "", recursive=False, include_entry=False)
    upload = workspace.begin_upload("f", 100)
    upload.write(b"half")
    assert watch.changes(workspace) == []
    upload.commit()
    assert [t for _, t in names_and_types(watch, workspace)] == ["CREATE", "CHMOD", "WRITE"]

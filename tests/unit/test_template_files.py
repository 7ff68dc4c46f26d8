"""COPY's rules (templates/files.py) and which RUN steps are pip installs (templates/pip.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kernel_gateway.templates.files import CopyError, FileStore, Owner, copy_archive
from kernel_gateway.templates.pip import MOUNT, parse_pip_install

OWNER = Owner(1000, 1000)


@pytest.fixture
def upload(tmp_path: Path) -> Path:
    path = tmp_path / "up.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {
            "folder/a.txt": b"a",
            "folder/sub/b.txt": b"b",
            "top.py": b"x",
            "../escape.txt": b"no",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("folder/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.txt"
        tar.addfile(link)
    return path


def placed(upload: Path, src: str, dest: str, mode: int | None = None) -> dict[str, int]:
    with copy_archive(upload, src, dest, "/home/user", OWNER, mode) as out:
        with tarfile.open(fileobj=out) as tar:
            return {m.name: m.mode for m in tar.getmembers()}


@pytest.mark.parametrize(
    ("src", "dest", "names"),
    [
        # A folder's contents, not the folder.
        ("folder", "/opt/data", {"opt/data/a.txt", "opt/data/sub/b.txt", "opt/data/link"}),
        # A glob: each match into the folder (a folder matched: its contents, as Docker).
        (
            "folder/*",
            "out",
            {"home/user/out/a.txt", "home/user/out/link", "home/user/out/b.txt"},
        ),
        # One file to a file name; to a folder with a trailing slash.
        ("top.py", "/app/main.py", {"app/main.py"}),
        ("top.py", "/app/", {"app/top.py"}),
        # The whole context.
        (
            ".",
            "/ctx",
            {"ctx/folder/a.txt", "ctx/folder/sub/b.txt", "ctx/folder/link", "ctx/top.py"},
        ),
    ],
)
def test_copy_follows_dockers_rules(upload: Path, src: str, dest: str, names: set[str]) -> None:
    assert set(placed(upload, src, dest)) == names


def test_nothing_outside_the_context_is_copied_and_owner_and_mode_are_set(upload: Path) -> None:
    assert not any("escape" in name for name in placed(upload, ".", "/x"))
    with (
        copy_archive(upload, "top.py", "/t", "/", OWNER, 0o750) as out,
        tarfile.open(fileobj=out) as tar,
    ):
        member = tar.getmember("t")
    assert (member.uid, member.gid, member.mode) == (1000, 1000, 0o750)


def test_a_source_nothing_matches_is_an_error(upload: Path) -> None:
    with pytest.raises(CopyError, match="no uploaded file matches"):
        placed(upload, "missing/*", "/x")


def test_an_upload_that_is_not_a_tar_is_refused_and_not_kept(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files", 1 << 20)
    files_hash = "0" * 64
    store.partial(files_hash).write_bytes(b"not a tar")
    with pytest.raises(CopyError):
        store.commit(files_hash)
    assert not store.has(files_hash) and not store.partial(files_hash).exists()


@pytest.mark.parametrize(
    ("command", "packages", "download", "flags"),
    [
        ("pip install numpy pandas==2.2.3", ("numpy", "pandas==2.2.3"), (), ()),
        ("pip install --user polars", ("polars",), (), ("--user",)),
        (
            "python -m pip install -i http://127.0.0.1:9/simple --no-deps x",
            ("x",),
            ("-i=http://127.0.0.1:9/simple", "--no-deps"),
            ("--no-deps",),
        ),
        (
            "pip3 install --index-url=https://idx/simple 'a>=1'",
            ("a>=1",),
            ("--index-url=https://idx/simple",),
            (),
        ),
    ],
)
def test_pip_installs_are_recognised(
    command: str, packages: tuple[str, ...], download: tuple[str, ...], flags: tuple[str, ...]
) -> None:
    pip = parse_pip_install(command)
    assert pip is not None
    assert (pip.packages, pip.download_options, pip.install_flags) == (packages, download, flags)
    assert f"--no-index --find-links {MOUNT}" in pip.command()


@pytest.mark.parametrize(
    "command",
    [
        "pip install -r requirements.txt",
        "pip install . ",
        "pip install x && echo done",
        "pip install x > log",
        "pip install --editable x",
        "pip uninstall x",
        "apt-get install -y git",
        "pip install",
    ],
)
def test_anything_else_runs_as_written(command: str) -> None:
    assert parse_pip_install(command) is None

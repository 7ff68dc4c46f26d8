"""build-image's steps that need no Docker: the lock, the staged context, the wheel fetch.

The fetch is tested with pip replaced by a recorder: what it is asked for (the engine's
architecture, the lock's Python, hashes required), that an unchanged lock starts no pip
at all, and that wheels no longer wanted are removed. The real download and build run in
`make image` and in the corpus tests (tests/integration/test_image_corpus.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernel_gateway.cli import gateway_image, image

CONTEXT = Path(__file__).resolve().parents[2] / "kernel-image"
# Debian suite -> the Python its python3 package is (the lock must be compiled for it).
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}


def test_lock_pins_every_requirement_with_hashes() -> None:
    lock = (CONTEXT / "requirements.lock").read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock[lock.index("\n", lock.index("#\n", 2)) :])
    pinned = {}
    for block in blocks:
        match = re.match(r"\s*([A-Za-z0-9._-]+)==(\S+)", block)
        if match:
            assert "--hash=sha256:" in block, block
            pinned[match.group(1).lower().replace("_", "-")] = match.group(2)
    wanted = [
        re.split(r"[<>=!;\[ ]", line.strip())[0].lower().replace("_", "-")
        for line in (CONTEXT / "requirements.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(wanted) >= 20
    missing = [name for name in wanted if name not in pinned]
    assert not missing, missing
    assert pinned["numpy"].startswith("2.")
    assert pinned["pandas"].startswith("2.")


def test_lock_is_compiled_for_the_base_images_python() -> None:
    base = image.base_image(CONTEXT / "Dockerfile")
    suite = image.debian_suite(base)
    assert image.lock_python(CONTEXT / "requirements.lock") == DEBIAN_PYTHON[suite]


def test_debian_suite_and_refusals() -> None:
    assert image.debian_suite("debian:trixie-slim") == "trixie"
    assert image.debian_suite("debian:bookworm") == "bookworm"
    with pytest.raises(SystemExit, match="can only make"):
        image.debian_suite("python:3.13-slim")


def test_platform_args_target_the_engine_and_the_lock() -> None:
    args = image.platform_args("arm64", "3.13")
    assert args[:4] == ["--python-version", "3.13", "--implementation", "cp"]
    assert "cp313" in args and "abi3" in args
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert "manylinux_2_17_aarch64" in platforms and "manylinux2014_aarch64" in platforms
    assert all("aarch64" in p for p in platforms)
    with pytest.raises(SystemExit, match="architecture"):
        image.platform_args("s390x", "3.13")


def test_stage_context_copies_files_and_puts_the_extras_in_place(tmp_path: Path) -> None:
    extra = tmp_path / "extra.txt"
    extra.write_text("rich==13.9.4\n")
    stage = image.stage_context(CONTEXT, tmp_path / "stage", extra)
    assert (stage / "Dockerfile").read_text() == (CONTEXT / "Dockerfile").read_text()
    assert (stage / image.WHEELS / "README.md").is_file()  # the Dockerfile copies it
    assert (stage / image.EXTRA).read_text() == "rich==13.9.4\n"
    assert image.has_requirements(stage / image.EXTRA)
    (stage / "stale.py").write_text("")
    (stage / image.WHEELS / "kept.whl").write_text("")
    image.stage_context(CONTEXT, stage, None)  # no extras now: the context's own file
    assert not (stage / "stale.py").exists()
    assert (stage / image.WHEELS / "kept.whl").exists()
    assert not image.has_requirements(stage / image.EXTRA)


def test_stage_context_refuses_a_folder_without_dockerfile(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no Dockerfile"):
        image.stage_context(tmp_path, tmp_path / "stage", None)
    with pytest.raises(SystemExit, match="cannot read --requirements"):
        image.stage_context(CONTEXT, tmp_path / "stage", tmp_path / "missing.txt")


def test_fetch_asks_pip_for_the_lock_then_skips_while_nothing_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = image.stage_context(CONTEXT, tmp_path / "stage", None)
    (stage / image.WHEELS / "old-1.0-py3-none-any.whl").write_text("")
    calls: list[list[str]] = []

    def fake_pip(args: list[str], total: int, out: object, what: str) -> set[str]:
        calls.append(args)
        names = {f"pkg{i}-1.0-py3-none-any.whl" for i in range(total)}
        for name in names:
            (stage / image.WHEELS / name).write_text("")
        return names

    monkeypatch.setattr(image, "pip_download", fake_pip)
    lines: list[str] = []
    image.fetch_wheels(stage, "amd64", lines.append)
    (args,) = calls
    assert "--require-hashes" in args and "--no-deps" in args
    assert args[args.index("--python-version") + 1] == "3.13"
    assert "manylinux_2_28_x86_64" in args
    assert not (stage / image.WHEELS / "old-1.0-py3-none-any.whl").exists()  # pruned
    assert any("removing old-1.0" in line for line in lines)

    image.fetch_wheels(stage, "amd64", lines.append)
    assert len(calls) == 1, "an unchanged lock must not start pip"
    assert "up to date" in lines[-1]

    image.fetch_wheels(stage, "arm64", lines.append)  # another engine: fetch again
    assert len(calls) == 2


def test_fetch_holds_extras_to_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "extra.txt"
    extra.write_text("rich\n")
    stage = image.stage_context(CONTEXT, tmp_path / "stage", extra)
    seen: list[tuple[list[str], str]] = []

    def fake_pip(args: list[str], total: int, out: object, what: str) -> set[str]:
        constraints = Path(args[args.index("-c") + 1]) if "-c" in args else None
        seen.append((args, constraints.read_text() if constraints else ""))
        return set()

    monkeypatch.setattr(image, "pip_download", fake_pip)
    image.fetch_wheels(stage, "amd64", lambda line: None)
    (locked, _), (extras, constraints) = seen
    assert "--require-hashes" in locked
    assert extras[extras.index("-r") + 1].endswith(image.EXTRA)
    assert "--require-hashes" not in extras and "--no-deps" not in extras
    # Their own folder: changing the extras leaves the locked wheels' layer cached.
    assert extras[extras.index("--dest") + 1] == str(stage / image.WHEELS / "extra")
    assert re.search(r"^numpy==2\.", constraints, re.MULTILINE)
    assert "--hash" not in constraints
    assert not (stage / "constraints.txt").exists()


def test_failed_pip_names_the_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage = image.stage_context(CONTEXT, tmp_path / "stage", None)
    monkeypatch.setattr("kernel_gateway.cli.image.sys.executable", "/bin/false")
    with pytest.raises(SystemExit, match="--no-download"):
        image.fetch_wheels(stage, "amd64", lambda line: None)
    assert not (stage / image.WHEELS / image.STAMP).exists()


def test_fetch_prunes_nothing_unless_every_locked_wheel_was_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pip's output is parsed for the wheels it kept: if that ever misses, keep all."""
    stage = image.stage_context(CONTEXT, tmp_path / "stage", None)
    (stage / image.WHEELS / "numpy-2.4.6-cp313-cp313-x.whl").write_text("")
    monkeypatch.setattr(image, "pip_download", lambda args, total, out, what: set())
    image.fetch_wheels(stage, "amd64", lambda line: None)
    assert (stage / image.WHEELS / "numpy-2.4.6-cp313-cp313-x.whl").exists()


def test_the_source_checkout_is_found_from_the_package() -> None:
    """The gateway image is built from this checkout: found wherever cli/ sits in the tree."""
    root = gateway_image.source_checkout()
    assert (root / "pyproject.toml").is_file() and (root / "kernel_gateway").is_dir()
    assert (image.default_context() / "Dockerfile").is_file()

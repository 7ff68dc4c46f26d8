"""Which template images a starting gateway removes (kernel_gateway/templates/sweep.py)."""

from __future__ import annotations

from pathlib import Path

from kernel_gateway.kernels.backends.labels import LABEL_HOST, LABEL_LOCK
from kernel_gateway.kernels.images import ListedImage
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.templates.sweep import unused

REF = "kernel-gateway-template:abc-12345678"


def image(
    runtime: RuntimeDir, root: Path, host: str | None = None, tags: tuple[str, ...] = (REF,)
) -> ListedImage:
    labels = {LABEL_HOST: host or runtime.hostname, LABEL_LOCK: str(root / "0123abcd.lock")}
    return ListedImage(id="sha256:1", tags=tags, labels=labels)


def test_an_image_of_this_runtime_dir_goes_only_when_no_record_names_it(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path)
    assert unused(image(runtime, runtime.root), runtime, named=set())
    assert not unused(image(runtime, runtime.root), runtime, named={REF})
    assert not unused(image(runtime, runtime.root, tags=()), runtime, named=set())  # a cache


def test_an_image_of_a_runtime_dir_that_is_gone_goes(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path / "mine")
    assert unused(image(runtime, tmp_path / "removed"), runtime, named=set())
    assert unused(image(runtime, tmp_path / "removed", tags=()), runtime, named=set())


def test_another_live_runtime_dirs_or_hosts_images_stay(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path / "mine")
    (tmp_path / "other").mkdir()
    assert not unused(image(runtime, tmp_path / "other"), runtime, named=set())
    assert not unused(image(runtime, tmp_path / "removed", host="elsewhere"), runtime, set())
    unlabelled = ListedImage(id="sha256:2", tags=(REF,), labels={})
    assert not unused(unlabelled, runtime, named=set())

"""Which template images a starting gateway removes (kernel_gateway/templates/sweep.py)."""

from __future__ import annotations

from pathlib import Path

from kernel_gateway.kernels.backends.labels import LABEL_HOST, LABEL_LOCK, LABEL_VIEW
from kernel_gateway.kernels.images import ListedImage
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.templates.sweep import unused

REF = "kernel-gateway-template:abc-12345678"


def image(
    runtime: RuntimeDir,
    root: Path,
    host: str | None = None,
    tags: tuple[str, ...] = (REF,),
    view: str | None = None,
) -> ListedImage:
    labels = {
        LABEL_HOST: host or runtime.hostname,
        LABEL_LOCK: str(root / "0123abcd.lock"),
        LABEL_VIEW: runtime.view if view is None else view,
    }
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


def test_a_gateway_in_another_file_system_view_judges_no_runtime_dir_it_cannot_see(
    tmp_path: Path,
) -> None:
    """A gateway in a container shares the host's name and engine, not its paths: the
    host gateway's runtime dir, missing from its view, is not gone."""
    runtime = RuntimeDir(tmp_path / "mine")
    assert runtime.view  # this process's mount namespace
    assert not unused(image(runtime, tmp_path / "unseen", view="1:2"), runtime, named=set())
    labelled = image(runtime, tmp_path / "unseen")  # a gateway before views were labelled
    older = ListedImage(
        labelled.id, labelled.tags, {k: v for k, v in labelled.labels.items() if k != LABEL_VIEW}
    )
    assert not unused(older, runtime, named=set())

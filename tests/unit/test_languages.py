"""Languages without kernels: kernelspecs read from an image's tar, names, settings, the
bridge's message handling, and what each front door makes of a language."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway.cli.image import language_families
from kernel_gateway.cli.run import language_for
from kernel_gateway.errors import UnknownLanguage
from kernel_gateway.in_kernel import bridge
from kernel_gateway.kernels.events import translate
from kernel_gateway.kernels.languages import (
    BUILTIN_PYTHON,
    Language,
    Languages,
    family_image,
    family_of,
    parse_kernelspecs,
)
from kernel_gateway.settings import Settings


def tar_of(files: dict[str, bytes]) -> bytes:
    """A tar as Docker's get_archive gives it for /opt/kernel/kernelspecs."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"kernelspecs/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def spec(**fields: Any) -> bytes:
    return json.dumps({"argv": ["k", "{connection_file}"], "display_name": "K", **fields}).encode()


def test_kernelspecs_are_read_from_the_images_tar() -> None:
    found = parse_kernelspecs(
        tar_of(
            {
                "r/kernel.json": spec(display_name="R", interrupt_mode="signal"),
                "r/version": b"4.5.0\n",
                "javascript/kernel.json": spec(
                    display_name="JavaScript (Deno)", interrupt_mode="message"
                ),
                "javascript/version": b"2.9.6",
                "python/kernel.json": spec(display_name="Python 3"),
                "python/version": b"3.13.5",
                "broken/kernel.json": b"{not json",
                "noargv/kernel.json": json.dumps({"display_name": "x"}).encode(),
                "Bad Name/kernel.json": spec(),
            }
        ),
        "img-x:latest",
    )
    by_name = {lang.name: lang for lang in found}
    assert set(by_name) == {"r", "javascript", "python"}
    r = by_name["r"]
    assert (r.version, r.image, r.interrupt_mode) == ("4.5.0", "img-x:latest", "signal")
    assert r.kernelspec == "/opt/kernel/kernelspecs/r/kernel.json" and not r.builtin
    assert by_name["javascript"].interrupt_mode == "message"
    python = by_name["python"]
    assert python.builtin and python.image is None and python.version == "3.13.5"


@pytest.mark.parametrize(
    ("python", "family", "expected"),
    [
        ("kernel-gateway-kernel:latest", "r", "kernel-gateway-kernel-r:latest"),
        ("kernel-gateway-kernel", "deno", "kernel-gateway-kernel-deno"),
        ("registry.local:5000/team/kernel:1.2", "bash", "registry.local:5000/team/kernel-bash:1.2"),
        ("registry.local:5000/kernel", "java", "registry.local:5000/kernel-java"),
    ],
)
def test_language_images_are_named_after_the_python_image(
    python: str, family: str, expected: str
) -> None:
    assert family_image(python, family) == expected


def test_families() -> None:
    assert family_of("typescript") == family_of("javascript") == "deno"
    assert family_of("python") is None and family_of("cobol") is None
    assert language_families(None) == ["r", "deno", "bash", "java"]
    assert language_families(["python", "typescript", "javascript"]) == ["deno"]
    assert language_families(["java", "r"]) == ["r", "java"]
    with pytest.raises(SystemExit, match="no image for 'cobol'"):
        language_families(["cobol"])


def test_an_unknown_language_is_refused_naming_the_others_python_first() -> None:
    r = Language("r", "R", "4.5.0", "img-r", "/opt/kernel/kernelspecs/r/kernel.json")
    languages = Languages([BUILTIN_PYTHON, r])
    assert languages.get_or_raise(None) is BUILTIN_PYTHON
    assert languages.get_or_raise("r") is r
    with pytest.raises(UnknownLanguage) as caught:
        languages.get_or_raise("cobol")
    assert caught.value.status_code == 400
    assert caught.value.error_type == "unknown_language"
    assert "'cobol'" in caught.value.message and "available: python, r" in caught.value.message


def test_language_settings(tmp_path: Path) -> None:
    settings = Settings(runtime_dir=tmp_path, languages="r, Bash", language_pool="r=2,bash=0")
    assert settings.language_list == ["python", "r", "bash"]
    assert settings.language_pool_sizes == {"r": 2, "bash": 0}
    assert Settings(runtime_dir=tmp_path).language_list is None  # auto
    for bad, message in (
        ({"language_pool": "r"}, "LANGUAGE=COUNT"),
        ({"language_pool": "r=x"}, "LANGUAGE=COUNT"),
        ({"language_pool": "python=2"}, "pool-size"),
        ({"languages": "python,C#"}, "not a language name"),
    ):
        with pytest.raises(ValueError, match=message):
            Settings(runtime_dir=tmp_path, **bad)  # type: ignore[arg-type]


def test_run_guesses_the_language_from_the_files_extension() -> None:
    assert language_for(None, Path("analysis.R")) == "r"
    assert language_for(None, Path("x.ts")) == "typescript"
    assert language_for(None, Path("job.sh")) == "bash"
    assert language_for(None, Path("Main.java")) == "java"
    assert language_for(None, Path("notes.txt")) is None
    assert language_for("JavaScript", Path("x.py")) == "javascript"  # the flag wins
    assert language_for(None, None) is None


def test_a_nameless_error_gets_a_name() -> None:
    def error(ename: str, evalue: str) -> Any:
        message = {
            "header": {"msg_type": "error"},
            "parent_header": {},
            "content": {"ename": ename, "evalue": evalue, "traceback": []},
        }
        return translate(message)

    assert error("", "127").data == {
        "ename": "ExitStatus",
        "evalue": "exit status 127",
        "traceback": [],
    }
    assert error("", "something broke").data["ename"] == "Error"
    assert error("TypeError", "boom").data["ename"] == "TypeError"


# -- the bridge's handling of messages (no sockets) ---------------------------------------------


def frames(
    msg_type: str, parent_id: str, parent_type: str = "execute_request", **content: Any
) -> list[bytes]:
    header = {"msg_type": msg_type, "msg_id": f"m-{msg_type}"}
    parent = {"msg_id": parent_id, "msg_type": parent_type}
    parts = [json.dumps(p).encode() for p in (header, parent, {}, content)]
    return [b"topic", b"<IDS|MSG>", b"sig", *parts]


def idle(parent: str, parent_type: str = "execute_request") -> list[bytes]:
    return frames("status", parent, parent_type, execution_state="idle")


def test_peek_reads_only_what_it_needs() -> None:
    assert bridge.peek(idle("c1")) == ("status", "c1", "execute_request", "idle")
    assert bridge.peek(frames("execute_result", "c1")) == (
        "execute_result",
        "c1",
        "execute_request",
        "",
    )
    assert bridge.peek([b"garbage"]) == ("", "", "", "")


def test_the_watcher_knows_which_cell_runs() -> None:
    watcher = bridge.Watcher()
    watcher.see(frames("status", "c1", execution_state="busy"))
    assert watcher.running == "c1"
    watcher.see(frames("status", "k1", "kernel_info_request", execution_state="idle"))
    assert watcher.running == "c1"  # another request's idle is not the cell's
    watcher.see(idle("c1"))
    assert watcher.running is None


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, str]] = []

    def send_multipart(self, message: list[bytes], copy: bool = True) -> None:
        self.sent.append(bridge.peek(message))


class Prober:
    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.count = 0

    def send(self, msg_type: str) -> str:
        self.count += 1
        msg_id = f"probe-{self.count}"
        self.sent.add(msg_id)
        return msg_id


def late_results() -> tuple[bridge.LateResults, Sink, Prober]:
    sink, prober = Sink(), Prober()
    return bridge.LateResults(sink, None, prober), sink, prober  # type: ignore[arg-type]


def test_an_idle_that_overtakes_its_result_waits_for_it() -> None:
    late, sink, prober = late_results()
    late.on_message(idle("c1"))
    assert sink.sent == [] and late.waiting and prober.count == 1
    late.on_message(frames("execute_result", "c1"))
    assert [m[0] for m in sink.sent] == ["execute_result", "status"]  # result, then idle
    assert not late.waiting
    late.on_message(idle("probe-1", "kernel_info_request"))
    assert len(sink.sent) == 2  # the probe's messages are never passed on


def test_a_cell_without_a_result_is_released_by_the_probe() -> None:
    late, sink, _ = late_results()
    late.on_message(frames("stream", "c1", name="stdout", text="hi\n"))
    late.on_message(idle("c1"))
    late.on_message(frames("status", "probe-1", "kernel_info_request", execution_state="busy"))
    assert [m[0] for m in sink.sent] == ["stream"]
    late.on_message(idle("probe-1", "kernel_info_request"))
    assert sink.sent[-1] == ("status", "c1", "execute_request", "idle")


def test_a_result_before_its_idle_costs_no_probe() -> None:
    late, sink, prober = late_results()
    late.on_message(frames("execute_result", "c1"))
    late.on_message(idle("c1"))
    assert [m[0] for m in sink.sent] == ["execute_result", "status"]
    assert prober.count == 0 and not late.waiting


def test_a_held_idle_is_released_after_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    late, sink, _ = late_results()
    late.on_message(idle("c1"))
    now = time.monotonic()
    monkeypatch.setattr(
        "kernel_gateway.in_kernel.bridge.time.monotonic", lambda: now + bridge.HOLD_SECONDS + 0.1
    )
    late.expire()
    assert sink.sent == [("status", "c1", "execute_request", "idle")] and not late.waiting


# -- which languages a docker gateway serves (images stubbed: no engine needed) ---------------


def find_languages(
    tmp_path: Path, images: Mapping[str, list[Language] | None], **settings: Any
) -> Languages:
    from kernel_gateway.kernels.backends import docker_languages

    async def kernelspecs_of(image: str) -> list[Language] | None:
        return images.get(image)

    found = docker_languages.find_languages(
        Settings(runtime_dir=tmp_path, **settings), kernelspecs_of
    )
    return asyncio.run(found)


R = Language("r", "R", "4.5.0", "kernel-gateway-kernel-r:latest", "/k/r/kernel.json")
SHELL = Language("shell", "Shell", "1", "ops/shell:1", "/k/shell/kernel.json")


def test_languages_are_those_of_the_images_found(tmp_path: Path) -> None:
    images = {"kernel-gateway-kernel-r:latest": [R], "ops/shell:1": [SHELL]}
    found = find_languages(tmp_path, images, language_images="ops/shell:1")
    assert list(found) == ["python", "r", "shell"]
    only = find_languages(tmp_path, images, languages="r", language_images="ops/shell:1")
    assert list(only) == ["python", "r"]


def test_a_language_or_image_asked_for_and_missing_stops_the_gateway(tmp_path: Path) -> None:
    from kernel_gateway.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match=r"build-image --languages r\)"):
        find_languages(tmp_path, {}, languages="python,r")
    with pytest.raises(BackendUnavailable, match="name an image with its kernelspec"):
        find_languages(tmp_path, {}, languages="cobol")
    with pytest.raises(BackendUnavailable, match="image ops/none:1 not found"):
        find_languages(tmp_path, {}, language_images="ops/none:1")


def test_a_shared_network_namespace_serves_python_only(tmp_path: Path) -> None:
    from kernel_gateway.errors import BackendUnavailable

    images = {"kernel-gateway-kernel-r:latest": [R]}
    assert list(find_languages(tmp_path, images, network="host")) == ["python"]
    with pytest.raises(BackendUnavailable, match="--languages python"):
        find_languages(tmp_path, images, network="container:other", languages="r")
    assert list(find_languages(tmp_path, images, network="bridge")) == ["python", "r"]


def test_python3_is_reserved_and_jupyter_aliases_start_their_language() -> None:
    from kernel_gateway.protocols.jupyter.kernels import kernel_name, language_of

    found = parse_kernelspecs(tar_of({"python3/kernel.json": spec()}), "img")
    assert found == []
    assert [language_of(n) for n in ("python3", "python", "ir", "deno", "jjava", "r")] == [
        "python",
        "python",
        "r",
        "typescript",
        "java",
        "r",
    ]
    assert kernel_name("python") == "python3" and kernel_name("r") == "r"


def test_the_bridge_fills_in_a_kernelspec_as_jupyter_does() -> None:
    kernelspec = {
        "argv": ["java", "-jar", "{resource_dir}/k.jar", "{connection_file}"],
        "env": {"PATH": "/opt/bin:${PATH}", "MISSING": "${NOPE}"},
    }
    command = bridge.command_of(kernelspec, "/opt/kernel/kernelspecs/java/kernel.json", "/c.json")
    assert command == ["java", "-jar", "/opt/kernel/kernelspecs/java/k.jar", "/c.json"]
    env = bridge.env_of(kernelspec, {"PATH": "/usr/bin"})
    assert env["PATH"] == "/opt/bin:/usr/bin" and env["MISSING"] == "${NOPE}"
    low, high = bridge.PORTS
    assert all(low <= p <= high for p in bridge.free_ports(5))

"""E2B's template API through the router (cluster/e2b_templates.py): how the nodes'
answers become one, and the ids a router asks each node to give a template and a build
(templates/service.py). The whole path, E2B's SDK through a router to two docker nodes, is
`tests/integration/test_router.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from kernel_gateway.cluster.directory import Node
from kernel_gateway.cluster.e2b_templates import (
    combined,
    merge_templates,
    node_tokens,
    status_json,
    with_ids,
)
from kernel_gateway.errors import BadRequest, InvalidRequest, TemplateConflict
from kernel_gateway.kernels.backends.base import Backend
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Languages
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.settings import Settings
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.principal import ADMIN

TEMPLATE_ID = "a1b2c3d4e5f6a7b8c9d0"
BUILD_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def node(name: str) -> Node:
    return cast(Node, type("FakeNode", (), {"name": name})())


def test_a_build_is_ready_once_ready_everywhere_and_failed_once_failed_anywhere() -> None:
    assert combined(["ready", "ready"]) == "ready"
    assert combined(["ready", "building"]) == "building"
    assert combined(["waiting", "waiting"]) == "waiting"
    assert combined(["waiting", "building"]) == "building"
    assert combined(["ready", "error"]) == "error"
    assert combined([]) == "building"


def test_one_status_names_the_node_whose_build_failed() -> None:
    found: list[tuple[Node, dict[str, Any]]] = [
        (node("n1"), {"status": "ready", "logEntries": [{"message": "one"}]}),
        (node("n2"), {"status": "error", "reason": {"message": "exit 3", "step": "1"}}),
    ]
    shown = status_json(found)
    assert shown["status"] == "error"
    assert shown["logEntries"] == [{"message": "one"}]  # the first node's
    assert shown["reason"] == {"message": "on node n2: exit 3", "step": "1"}
    alone = status_json([(node("n1"), {"status": "error", "reason": {"message": "exit 3"}})])
    assert alone["reason"]["message"] == "exit 3"  # one node: nothing to tell apart
    ready = status_json([(node("n1"), {"status": "ready", "reason": {"message": "stale"}})])
    assert "reason" not in ready


def test_templates_are_listed_once_per_name_oldest_first() -> None:
    n1 = [
        {"templateID": "b" * 20, "names": ["late"], "createdAt": "2026-02", "buildStatus": "ready"},
        {"templateID": "a" * 20, "names": ["both"], "createdAt": "2026-01", "buildStatus": "ready"},
    ]
    n2 = [
        {
            "templateID": "a" * 20,
            "names": ["both"],
            "createdAt": "2026-01",
            "buildStatus": "building",
        },
        "not a template",
    ]
    merged = merge_templates([n1, n2])
    assert [t["names"] for t in merged] == [["both"], ["late"]]
    assert [t["buildStatus"] for t in merged] == ["building", "ready"]


def test_an_upload_url_carries_a_token_per_node() -> None:
    assert node_tokens(["n1:abc", "n2:d:e"]) == {"n1": "abc", "n2": "d:e"}
    assert node_tokens(["plain"]) == {"": "plain"}  # a node's own URL: for every node
    assert node_tokens([]) == {}


def test_the_others_get_the_first_nodes_ids_in_the_same_request() -> None:
    ids = {"templateID": TEMPLATE_ID, "buildID": BUILD_ID}
    sent = json.loads(with_ids(b'{"name": "x", "tags": ["v1"]}', ids))
    assert sent == {"name": "x", "tags": ["v1"], **ids}
    assert json.loads(with_ids(b"", ids)) == ids
    for bad in (b"[1]", b"{nope"):
        with pytest.raises(BadRequest):
            with_ids(bad, ids)


class FakeBackend:
    name = "docker"
    languages = Languages([BUILTIN_PYTHON])
    images = object()  # making a template or a build record builds nothing


def service(tmp_path: Path) -> Templates:
    settings = Settings(runtime_dir=tmp_path)
    return Templates(settings, cast(Backend, FakeBackend()), RuntimeDir(tmp_path), None)  # type: ignore[arg-type]


async def test_a_node_gives_a_template_and_a_build_the_ids_asked_for(tmp_path: Path) -> None:
    templates = service(tmp_path)
    template = templates.create("routed", exist_ok=True, template_id=TEMPLATE_ID, owner=ADMIN)
    assert template.id == TEMPLATE_ID and templates.find(TEMPLATE_ID, ADMIN) is template
    build = templates.new_build(template, ["v1"], build_id=BUILD_ID)
    assert build.id == BUILD_ID and template.build(BUILD_ID) is build
    # The same name again (a node that had it): its own id stays.
    assert templates.create("routed", exist_ok=True, template_id="z" * 20, owner=ADMIN) is template
    with pytest.raises(TemplateConflict, match="id"):
        templates.create("other", exist_ok=True, template_id=TEMPLATE_ID, owner=ADMIN)
    with pytest.raises(TemplateConflict, match="build"):
        templates.new_build(
            templates.create("third", exist_ok=True, owner=ADMIN), None, build_id=BUILD_ID
        )


@pytest.mark.parametrize("template_id", ["short", "A1B2C3D4E5F6A7B8C9D0", "a1b2c3d4e5f6a7b8c9d0x"])
async def test_a_template_id_asked_for_is_checked(tmp_path: Path, template_id: str) -> None:
    with pytest.raises(InvalidRequest, match="20 lowercase"):
        service(tmp_path).create("x", exist_ok=True, template_id=template_id, owner=ADMIN)


@pytest.mark.parametrize("build_id", ["nope", BUILD_ID.upper(), BUILD_ID.replace("-", "")])
async def test_a_build_id_asked_for_is_checked(tmp_path: Path, build_id: str) -> None:
    templates = service(tmp_path)
    template = templates.create("x", exist_ok=True, owner=ADMIN)
    with pytest.raises(InvalidRequest, match="UUID"):
        templates.new_build(template, None, build_id=build_id)

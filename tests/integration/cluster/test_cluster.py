"""Cluster mode on a real three-node Docker Swarm (the manager and two worker engines in
network namespaces, tests/support/swarm.py), deployed from deploy/stack.yml.

The tests share one cluster and run in order: the ones that break something (a router
killed, a rolling update, a worker's engine killed) come last.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel_gateway.client import Client
from tests.support.deployment import (
    NODE_SERVICE,
    OVERLAY,
    ROUTER_SERVICE,
    Deployment,
    deploy,
    remove,
)
from tests.support.swarm import Swarm, require_cluster

pytestmark = pytest.mark.cluster

KERNEL_IMAGE = "kernel-gateway-kernel:latest"
GATEWAY_IMAGE = "kernel-gateway:latest"
MAX_SESSIONS = 3


@pytest.fixture(scope="module")
def bystander(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernel container of a live gateway on the host (not of the cluster): labelled as
    gateways label theirs, its instance lock held by this test. The node gateway on the
    manager shares the host's name and engine but not its paths, so it cannot see that lock;
    it must leave the container alone (the id)."""
    require_cluster()
    import docker

    from kernel_gateway.kernels.backends.labels import container_labels
    from kernel_gateway.kernels.runtime_dir import RuntimeDir

    runtime = RuntimeDir(tmp_path_factory.mktemp("host-gateway"))
    runtime.open()
    client = docker.from_env()
    container = client.containers.run(
        KERNEL_IMAGE,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels=container_labels(runtime, "kernel"),
        name=f"kg-{runtime.instance}-bystander",
    )
    try:
        yield str(container.id)
    finally:
        container.remove(force=True)
        client.close()
        runtime.close()


@pytest.fixture(scope="module")
def cluster(bystander: str) -> Iterator[Deployment]:
    require_cluster()
    from kernel_gateway.cli.gateway_image import build_gateway_image
    from kernel_gateway.cli.main import default_cache_dir

    build_gateway_image(
        GATEWAY_IMAGE, KERNEL_IMAGE, lambda _: None, cache_dir=default_cache_dir({})
    )
    swarm = Swarm.start(workers=2, images=[KERNEL_IMAGE, GATEWAY_IMAGE])
    try:
        deployment = deploy(swarm, max_sessions=MAX_SESSIONS)
        try:
            yield deployment
        finally:
            remove(deployment)
    finally:
        swarm.stop()
    assert swarm.leftovers() == []


@pytest.fixture(scope="module")
def sessions(cluster: Deployment) -> dict[str, str]:
    """Six sessions, each holding `mark = <its index>`, made through one router (each
    router counts its own placements between polls of the nodes' counts: one router's
    creates spread exactly), then used through every router."""
    made: dict[str, str] = {}
    for i in range(6):
        with cluster.client(cluster.swarm.manager) as c:
            answer = c.post("/sessions")
            assert answer.status_code == 201, answer.text
            sid = answer.json()["id"]
            assert _run(c, sid, f"mark = {i}\nhistory = [{i}]")["status"] == "ok"
            made[sid] = str(i)
    return made


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def _run(c: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    """Run a cell; its stdout and done status."""
    answer = c.post(f"/sessions/{sid}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    events = _events(answer.text)
    stdout = "".join(d["text"] for name, d in events if name == "stdout")
    done = [d for name, d in events if name == "done"]
    assert done, answer.text
    return {"stdout": stdout, "status": done[0]["status"], "events": events}


def test_the_node_gateways_leave_a_host_gateways_kernels_alone(
    cluster: Deployment, bystander: str
) -> None:
    import docker

    client = docker.from_env()
    try:
        assert client.containers.get(bystander).status == "running"
    finally:
        client.close()


def test_sessions_land_on_several_nodes_and_keep_state_across_routers(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    nodes = Counter(sid.partition(".")[0] for sid in sessions)
    names = cluster.node_names()
    assert set(nodes) <= set(names)
    # The emptiest node first: two on each of the three, though each had room for three.
    assert sorted(nodes.values()) == [2, 2, 2], nodes
    for step, (sid, mark) in enumerate(sessions.items()):
        # Each session is driven through every router in turn.
        for k, node in enumerate(cluster.swarm.nodes):
            with cluster.client(cluster.swarm.nodes[(step + k) % 3]) as c:
                out = _run(c, sid, f"history.append({k})\nprint(mark, len(history))")
                assert out["stdout"] == f"{mark} {k + 2}\n", (node.name, out)


def test_hibernated_sessions_resume_on_their_own_node(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    """Hibernated through one router, seen through another, resumed through a third: on the
    node its id names, with its variables."""
    routers = cluster.swarm.nodes
    by_node = {sid.partition(".")[0]: sid for sid in sessions}
    for step, sid in enumerate(list(by_node.values())[:2]):
        with cluster.client(routers[step % 3]) as c:
            answer = c.post(f"/sessions/{sid}/hibernate")
            assert answer.status_code == 200, answer.text
            assert answer.json()["hibernation"]["lost"] == []
        with cluster.client(routers[(step + 1) % 3]) as c:
            assert c.get(f"/sessions/{sid}").json()["status"] == "hibernated"
        with cluster.client(routers[(step + 2) % 3]) as c:
            out = _run(c, sid, "print(mark, len(history))")
            assert out["stdout"].split()[0] == sessions[sid], out
            resumed = [d for name, d in out["events"] if name == "resumed"]
            assert resumed and resumed[0]["lost"] == [], out


def test_a_session_is_forked_and_snapshotted_through_the_routers(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    """A fork through one router is its session's node's, and is driven through the others;
    a snapshot is its node's (named in its id), listed through any router, and sessions
    start from it there, by id or by name."""
    routers = cluster.swarm.nodes
    sid = next(iter(sessions))
    node = sid.partition(".")[0]
    with cluster.client(routers[0]) as c:
        answer = c.post(f"/sessions/{sid}/fork", json={"count": 1})
        assert answer.status_code == 201, answer.text
        forks = answer.json()["forks"]
        assert all("session" in f for f in forks), forks
        (fork,) = [f["session"]["id"] for f in forks]
    assert fork.partition(".")[0] == node and fork != sid
    with cluster.client(routers[1]) as c:
        out = _run(c, fork, "history.append('fork')\nprint(mark, len(history))")
        assert out["stdout"].split()[0] == sessions[sid], out
        assert c.delete(f"/sessions/{fork}").status_code == 204
        taken = c.post(f"/sessions/{sid}/snapshots", json={"name": "cluster-snap"})
        assert taken.status_code == 201, taken.text
        snapshot = taken.json()
    assert snapshot["id"].startswith(f"{node}.snap-"), snapshot
    with cluster.client(routers[2]) as c:
        listed = c.get("/snapshots").json()
        assert [s["id"] for s in listed["snapshots"]] == [snapshot["id"]], listed
        for reference in (snapshot["id"], "cluster-snap"):
            made = c.post("/sessions", json={"snapshot": reference})
            assert made.status_code == 201, made.text
            started = made.json()["id"]
            assert started.partition(".")[0] == node
            out = _run(c, started, "print(mark, 'fork' in history)")
            assert out["stdout"] == f"{sessions[sid]} False\n", out
            assert c.delete(f"/sessions/{started}").status_code == 204
        assert c.get("/snapshots/cluster-snap").json()["id"] == snapshot["id"]
        assert c.delete(f"/snapshots/{snapshot['id']}").status_code == 204
        gone = c.get(f"/snapshots/{snapshot['id']}")
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "snapshot_not_found"


def test_a_volume_is_its_nodes_and_its_sessions_run_there(cluster: Deployment) -> None:
    """A volume made through one router lives on one node (named in its id); its files are
    reached through any router, by id or by name, and every session that mounts it is placed
    on its node, whichever router is asked. (One session at a time: the module's sessions
    leave each node one free place.)"""
    routers = cluster.swarm.nodes
    with cluster.client(routers[0]) as c:
        made = c.post("/volumes", json={"name": "cluster-data", "size": "64m"})
        assert made.status_code == 201, made.text
        volume = made.json()
    node = volume["id"].partition(".")[0]
    assert node in cluster.node_names()
    with cluster.client(routers[1]) as c:
        put = c.put("/volumes/cluster-data/files/in/seed.txt", content=b"seeded")
        assert put.status_code == 201, put.text
        listed = c.get("/volumes").json()
        assert [v["id"] for v in listed["volumes"]] == [volume["id"]], listed
    started: list[str] = []
    try:
        for step, reference in enumerate(("cluster-data", volume["id"])):
            with cluster.client(routers[(step + 2) % 3]) as c:
                made = c.post("/sessions", json={"volumes": {reference: "/mnt/shared"}})
                assert made.status_code == 201, made.text
                sid = made.json()["id"]
                started.append(sid)
                assert sid.partition(".")[0] == node
                code = "print(open('/mnt/shared/in/seed.txt').read())\n"
                code += f"open('/mnt/shared/{step}', 'w').close()"
                assert _run(c, sid, code)["stdout"] == "seeded\n"
            with cluster.client(routers[0]) as c:
                busy = c.delete(f"/volumes/{volume['id']}")
                assert busy.status_code == 409, busy.text
                assert busy.json()["error"]["type"] == "volume_in_use"
                assert c.delete(f"/sessions/{started.pop()}").status_code == 204
        with cluster.client(routers[0]) as c:
            entries = c.get(f"/volumes/{volume['id']}/entries").json()["entries"]
            assert sorted(e["path"] for e in entries) == ["0", "1", "in"]
    finally:
        with cluster.client(routers[0]) as c:
            for sid in started:
                c.delete(f"/sessions/{sid}")
            assert c.delete("/volumes/cluster-data").status_code == 204
            gone = c.get(f"/volumes/{volume['id']}")
            assert gone.status_code == 404 and gone.json()["error"]["type"] == "volume_not_found"


def test_router_health_shows_every_node_and_capacity(cluster: Deployment) -> None:
    for node in cluster.swarm.nodes:
        health = cluster.health(node)
        assert health["role"] == "router" and health["status"] == "ok"
        assert sorted(n["name"] for n in health["nodes"]) == sorted(cluster.node_names())
        for n in health["nodes"]:
            assert n["state"] == "up" and n["max_sessions"] == MAX_SESSIONS
            assert n["backend"] == "docker"
        assert health["capacity"]["max_sessions"] == 3 * MAX_SESSIONS


def test_capacity_is_the_sum_of_the_nodes(cluster: Deployment, sessions: dict[str, str]) -> None:
    extra: list[str] = []
    with cluster.client(cluster.swarm.manager) as c:
        try:
            while True:
                answer = c.post("/sessions")
                if answer.status_code != 201:
                    break
                extra.append(answer.json()["id"])
                assert len(extra) <= 3 * MAX_SESSIONS
            assert answer.status_code == 429, answer.text
            assert answer.json()["error"]["type"] == "too_many_sessions"
            assert len(sessions) + len(extra) == 3 * MAX_SESSIONS
            per_node = Counter(s.partition(".")[0] for s in [*sessions, *extra])
            assert set(per_node.values()) == {MAX_SESSIONS}
        finally:
            for sid in extra:
                assert c.delete(f"/sessions/{sid}").status_code == 204


def test_stateless_requests_spread_over_nodes(cluster: Deployment) -> None:
    with cluster.client(cluster.swarm.manager) as c:
        for _ in range(9):
            answer = c.post(
                "/execute",
                json={"code": "print(6 * 7)"},
                headers={"Accept": "application/json"},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["stdout"] == "42\n"
        metrics = c.get("/metrics").text
    placed = [
        line
        for line in metrics.splitlines()
        if line.startswith("kernel_gateway_router_placements_total")
        and 'kind="stateless"' in line
        and 'outcome="placed"' in line
        and not line.endswith(" 0.0")
    ]
    assert len(placed) >= 2, placed


def _as_key(cluster: Deployment, router: Any, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.url(router), headers={"Authorization": f"Bearer {secret}"}, timeout=60
    )


def test_a_key_made_through_one_router_works_through_every_other(cluster: Deployment) -> None:
    """Made through one router, the key works through the others at once (no poll waited
    for): it owns what it makes, sees nothing of another key's, its session quota holds
    across the nodes, E2B's API takes it on any node, its usage adds up every node's, and
    revoked through one router it is refused through all."""
    routers = cluster.swarm.nodes
    with cluster.client(routers[0]) as admin:
        made = admin.post("/keys", json={"name": "team-a", "quotas": {"max_sessions": 2}})
        assert made.status_code == 201, made.text
        key = made.json()
        other = admin.post("/keys", json={"name": "team-b"}).json()
    mine: list[str] = []
    sandbox = None
    try:
        for step, router in enumerate(routers):
            with _as_key(cluster, router, key["secret"]) as c:
                assert [k["id"] for k in c.get("/keys").json()["keys"]] == [key["id"]]
                created = c.post("/sessions")
                if step < 2:
                    assert created.status_code == 201, created.text
                    assert created.json()["owner"] == key["id"]
                    mine.append(created.json()["id"])
                else:  # its quota of 2, held on two nodes: counted across the cluster
                    assert created.status_code == 429, created.text
                    assert created.json()["error"]["type"] == "quota_exceeded"
                listed = c.get("/sessions").json()["sessions"]
                assert sorted(s["id"] for s in listed) == sorted(mine)
                for sid in mine:
                    assert _run(c, sid, "print(6 * 7)")["stdout"] == "42\n"
        assert len({sid.partition(".")[0] for sid in mine}) == 2  # on two nodes
        with _as_key(cluster, routers[1], other["secret"]) as c:
            assert c.get("/sessions").json()["sessions"] == []
            for sid in mine:
                assert c.get(f"/sessions/{sid}").status_code == 404
                assert c.post(f"/sessions/{sid}/execute", json={"code": "1"}).status_code == 404
            assert c.get(f"/keys/{key['id']}").status_code == 404
            assert c.post("/keys", json={"name": "mine-now"}).status_code == 403
        # E2B's API: the node authenticates the key itself (it holds every key).
        e2b = httpx.post(
            cluster.url(routers[2]) + "/e2b/sandboxes",
            json={"templateID": "code-interpreter-v1", "timeout": 60},
            headers={"X-API-KEY": other["secret"]},
            timeout=60,
        )
        assert e2b.status_code == 201, e2b.text
        sandbox = e2b.json()["sandboxID"]
        listed_e2b = httpx.get(
            cluster.url(routers[0]) + "/e2b/v2/sandboxes",
            headers={"X-API-KEY": key["secret"]},
            timeout=60,
        )
        assert listed_e2b.status_code == 200 and sandbox not in listed_e2b.text
        with cluster.client(routers[2]) as admin:
            used = admin.get(f"/keys/{key['id']}/usage").json()
            assert (used["sessions_created"], used["sessions_held"]) == (2, 2), used
            assert admin.delete(f"/keys/{key['id']}").status_code == 204
        for router in routers:  # at once, whichever router made the change
            with _as_key(cluster, router, key["secret"]) as c:
                assert c.get(f"/sessions/{mine[0]}").status_code == 401
    finally:
        with cluster.client(routers[0]) as admin:
            for sid in mine:
                admin.delete(f"/sessions/{sid}")
            if sandbox is not None:
                httpx.delete(
                    cluster.url(routers[0]) + f"/e2b/sandboxes/{sandbox}",
                    headers={"X-API-KEY": cluster.token},
                    timeout=60,
                )
            admin.delete(f"/keys/{other['id']}")


def test_streams_through_the_router_stay_live(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    sid = next(iter(sessions))
    code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"
    with cluster.client(cluster.swarm.workers[0]) as c:
        arrived: list[float] = []
        with c.stream("POST", f"/sessions/{sid}/execute", json={"code": code}) as answer:
            for line in answer.iter_lines():
                if line.startswith("event: "):
                    arrived.append(time.monotonic())
        assert len(arrived) >= 3
        assert arrived[-1] - arrived[0] > 1.0  # the first line came before the sleep ended


def test_e2bs_sdk_through_the_routers(cluster: Deployment) -> None:
    """E2B's own SDK pointed at one router: sandboxes placed on the nodes, their code, files
    and commands served by their node, then driven and killed through other routers."""
    sdk = pytest.importorskip("e2b_code_interpreter")
    manager, *workers = cluster.swarm.nodes

    def options(node: Any) -> dict[str, Any]:
        base = cluster.url(node) + "/e2b"
        return {"api_key": cluster.token, "api_url": base, "sandbox_url": base}

    made = [sdk.Sandbox.create(timeout=120, **options(manager)) for _ in range(2)]
    try:
        assert len({sbx.sandbox_id.partition(".")[0] for sbx in made}) == 2  # two nodes
        first = made[0]
        first.run_code("x = 41")
        first.files.write("/home/user/in.txt", "through the router")
        assert first.run_code("open('in.txt').read()").text == "through the router"
        done = first.commands.run("cat in.txt; echo; id -u")
        assert done.stdout == "through the router\n1000\n", done.stdout
        for node in workers:  # the same sandbox through each other router
            again = sdk.Sandbox.connect(first.sandbox_id, **options(node))
            assert again.run_code("x + 1").text == "42"
        listed = {s.sandbox_id for s in sdk.Sandbox.list(**options(workers[0])).next_items()}
        assert {sbx.sandbox_id for sbx in made} <= listed
    finally:
        for sbx in made:
            sdk.Sandbox.kill(sbx.sandbox_id, **options(workers[-1]))
    assert sdk.Sandbox.kill(made[0].sandbox_id, **options(manager)) is False


def test_no_kernel_port_is_reachable_from_the_overlay(cluster: Deployment) -> None:
    swarm = cluster.swarm
    for node in swarm.nodes:
        kernels = cluster.kernels(node)
        assert kernels, f"no kernel containers on {node.name}"
        for kernel in kernels:
            assert kernel["HostConfig"]["NetworkMode"] == "none"
            assert set(kernel["NetworkSettings"]["Networks"]) <= {"none"}
            assert not kernel["NetworkSettings"]["Ports"]
    # From a container on the cluster's overlay: every TCP port of every node gateway.
    # Only the gateway's own API (8888) may answer.
    scan = (
        "import asyncio, json, socket\n"
        "addrs = sorted({a[4][0] for a in socket.getaddrinfo('tasks.node', 8888)})\n"
        "async def probe(host, port, sem, found):\n"
        "    async with sem:\n"
        "        try:\n"
        "            _, w = await asyncio.wait_for(asyncio.open_connection(host, port), 2)\n"
        "            found.append(f'{host}:{port}'); w.close()\n"
        "        except (OSError, asyncio.TimeoutError):\n"
        "            pass\n"
        "async def main():\n"
        "    sem, found = asyncio.Semaphore(500), []\n"
        "    ports = [(h, p) for h in addrs for p in range(1, 65536)]\n"
        "    await asyncio.gather(*(probe(h, p, sem, found) for h, p in ports))\n"
        "    print(json.dumps({'addresses': len(addrs), 'open': sorted(found)}))\n"
        "asyncio.run(main())\n"
    )
    out = swarm.cli(
        swarm.manager,
        "run",
        "--rm",
        "--network",
        OVERLAY,
        "--entrypoint",
        "/opt/venv/bin/python",
        "kernel-gateway-kernel:latest",
        "-c",
        scan,
        timeout=600,
    ).stdout.strip()
    result = json.loads(out.splitlines()[-1])
    assert result["addresses"] == 3, out
    assert len(result["open"]) == 3 and all(p.endswith(":8888") for p in result["open"]), out


def test_a_killed_router_leaves_every_session_served(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    swarm = cluster.swarm
    victim = swarm.workers[0]
    (container,) = cluster.containers(victim, ROUTER_SERVICE)
    swarm.cli(victim, "kill", container)
    # The client fails over (Swarm restarts the router after 3 s): the victim first in
    # its list, every call still goes through.
    others = [cluster.url(n) for n in swarm.nodes if n is not victim]
    with Client([cluster.url(victim), *others], token=cluster.token) as client:
        for sid, mark in sessions.items():
            assert client.session(sid).run("print(mark)").stdout == f"{mark}\n"
        assert client.replicas is not None and client.replicas.current != 0
    with pytest.raises(httpx.TransportError):
        httpx.get(cluster.url(victim) + "/health", timeout=2)
    cluster.wait_ready()  # Swarm restarts the router


def test_a_rolling_update_of_the_node_gateways_keeps_every_session(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    swarm = cluster.swarm
    before = {n.name: cluster.containers(n, NODE_SERVICE) for n in swarm.nodes}
    counts: dict[str, int] = {}
    with cluster.client(swarm.manager) as c:
        for sid in sessions:
            counts[sid] = c.get(f"/sessions/{sid}").json()["execution_count"]
    update = swarm.cli(
        swarm.manager,
        "service",
        "update",
        "--detach=false",
        "--env-add",
        "KG_ROLLED=1",
        NODE_SERVICE,
        timeout=300,
    )
    assert update.returncode == 0
    # The CLI may call an update converged before its last node is done: ask Swarm.
    deadline = time.monotonic() + 240
    while True:
        state = swarm.cli(
            swarm.manager, "service", "inspect", "--format", "{{.UpdateStatus.State}}", NODE_SERVICE
        ).stdout.strip()
        if state == "completed":
            break
        assert state == "updating" and time.monotonic() < deadline, state
        time.sleep(1)
    after = {n.name: cluster.containers(n, NODE_SERVICE) for n in swarm.nodes}
    for name in before:
        assert after[name] and set(after[name]).isdisjoint(before[name]), (before, after)
    # Calls made right after the update: the Python client retries node_unavailable.
    with Client(cluster.urls, token=cluster.token) as client:
        for sid, mark in sessions.items():
            session = client.session(sid)
            assert session.run("print(mark, len(history))").stdout.split()[0] == mark
            assert session.info()["execution_count"] == counts[sid] + 1


def test_a_dead_worker_loses_only_its_sessions(
    cluster: Deployment, sessions: dict[str, str]
) -> None:
    swarm = cluster.swarm
    victim = swarm.workers[1]
    survivors = [n for n in swarm.nodes if n is not victim]
    doomed = [sid for sid in sessions if sid.startswith(victim.node_id + ".")]
    kept = [sid for sid in sessions if sid not in doomed]
    assert doomed and kept
    swarm.kill_node(victim)
    killed_at = time.monotonic()
    with cluster.client(survivors[0]) as c:
        for sid in doomed:
            while True:
                answer = c.get(f"/sessions/{sid}")
                if answer.status_code == 410:
                    break
                assert answer.status_code == 503, answer.text
                assert time.monotonic() - killed_at < 30, "no clear error within 30 s"
            assert answer.json()["error"]["type"] == "node_lost"
        took = time.monotonic() - killed_at
        print(f"\nnode_lost {took:.1f} s after the worker's engine was killed")
        assert took < 30
        for sid in kept:
            assert _run(c, sid, "print(mark)")["stdout"] == f"{sessions[sid]}\n"
        made = c.post("/sessions")
        assert made.status_code == 201
        assert not made.json()["id"].startswith(victim.node_id + ".")
        assert c.delete(f"/sessions/{made.json()['id']}").status_code == 204
        health = c.get("/health").json()
        states = {n["name"]: n["state"] for n in health["nodes"]}
        assert states[victim.node_id] == "lost"
        assert health["status"] == "degraded"

"""Durable sessions on the docker backend: a real gateway process, SIGKILLed and SIGTERMed.

Each test runs `kernel-gateway serve --persist-sessions` as a child process on one
runtime dir and port, stops it the hard or the soft way, starts the next one, and
checks what users see: variables, files, execution counts, the cell that was
running, sessions that could not be adopted, and nothing left behind at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from kernel_gateway.client import Client
from kernel_gateway.kernels.storage import loop_devices_of, mounts_under
from tests.support.api import parse_sse
from tests.support.backends import require_docker, require_languages
from tests.support.ports import free_port
from tests.support.processes import Gateway as GatewayProcess
from tests.support.processes import serve_command
from tests.support.scripted_model import Reply, ScriptedModel, last_tool_output, last_user_text

LABEL_INSTANCE = "io.kernel-gateway.instance"


class Gateway(GatewayProcess):
    """`kernel-gateway serve --backend docker` as a process, restarted on the same port and
    runtime dir; `--persist-sessions` unless a start says otherwise."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.runtime = tmp / "rt"
        self.port = free_port()
        cmd = serve_command(self.runtime, self.port, "--backend", "docker", *args)
        env = {"KG_PRELOAD": "", "KG_KERNEL_START_TIMEOUT": "120"}
        super().__init__(cmd, self.port, tmp, env=env, up_within=60)

    def start(self, *extra: str, persist: bool = True) -> float:
        return super().start(*(["--persist-sessions"] if persist else []), *extra)

    def stop(self, sig: int = signal.SIGTERM, wait: float = 60, *, force: bool = False) -> int:
        return super().stop(sig, wait, force=force)

    def wait_for_warm_kernels(self, count: int) -> None:
        deadline = time.monotonic() + 120
        while httpx.get(self.url + "/health").json()["pool"]["warm"] < count:
            assert time.monotonic() < deadline, "the warm pool never filled"
            time.sleep(0.1)

    def instance(self) -> str:
        return str(httpx.get(self.url + "/health").json()["instance"])

    def record(self, instance: str, sid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            (self.runtime / instance / "sessions" / f"{sid}.json").read_text()
        )
        return data

    def close(self) -> None:
        if self.running:
            self.stop(signal.SIGKILL)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    require_docker()
    if os.geteuid() != 0:
        pytest.skip("the durable-session tests run a root gateway (capped session disks)")
    gateway = Gateway(tmp_path, "--pool-size", "1", "--workspace-size", "256m")
    try:
        yield gateway
    finally:
        gateway.close()
        # Whatever a test left, the next gateway without the flag adopts and removes.
        gateway.start(persist=False)
        gateway.stop()
        assert leftovers(gateway) == ([], [], [], [])


def leftovers(gw: Gateway) -> tuple[list[str], list[str], list[str], list[str]]:
    """Containers of any instance in the runtime dir, mounts, loop devices, files left."""
    client = docker.from_env()
    try:
        names = [p.name.removesuffix(".lock") for p in gw.runtime.iterdir()]
        containers = [
            c.name or ""
            for n in set(names)
            for c in client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={n}"})
        ]
    finally:
        client.close()
    prefix = str(gw.runtime.resolve()) + "/"
    loops = loop_devices_of(lambda backing: str(backing).startswith(prefix))
    # API keys are kept for every later gateway on the folder (docs/keys.md), by design.
    files = sorted(str(p) for p in gw.runtime.iterdir() if p.name != "keys.sqlite3")
    return containers, mounts_under(gw.runtime), loops, files


def run(
    url: str, sid: str, code: str, **body: Any
) -> tuple[list[tuple[str, dict[str, Any]]], httpx.Headers]:
    with httpx.stream(
        "POST", f"{url}/sessions/{sid}/execute", json={"code": code, **body}, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        return list(parse_sse(response.iter_lines())), response.headers


def stdout(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(data["text"] for name, data in events if name == "stdout")


def done(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    assert events and events[-1][0] == "done", events
    return events[-1][1]


# -- a variable and a file, across each kind of stop -------------------------------------------


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_variables_files_and_counts_survive_a_restart(gw: Gateway, how: str) -> None:
    gw.start()
    sid = httpx.post(gw.url + "/sessions", timeout=60).json()["id"]
    payload = random.Random(how).randbytes(300_000)
    assert httpx.put(f"{gw.url}/sessions/{sid}/files/data/in.bin", content=payload).is_success
    events, _ = run(
        gw.url,
        sid,
        "x = 41\nopen('data/out.bin', 'wb').write(open('data/in.bin', 'rb').read()[::-1])",
    )
    assert done(events)["status"] == "ok" and done(events)["execution_count"] == 1
    time.sleep(1.5)  # an idle clock worth checking
    gw.stop(getattr(signal, how))

    # While no gateway runs, a client's call waits (connection refused is retried).
    outcome: dict[str, Any] = {}

    def call() -> None:
        with Client(gw.url, reconnect_seconds=30) as client:
            outcome["run"] = client.session(sid).run("print(x + 1)")

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    gw.start()
    caller.join(60)
    result = outcome["run"]
    assert result.stdout == "42\n" and result.ok
    assert result.done is not None and result.done.execution_count == 2  # counts go on
    assert not result.done.restarted
    got = httpx.get(f"{gw.url}/sessions/{sid}/files/data/out.bin").content
    assert got == payload[::-1]
    assert httpx.get(f"{gw.url}/sessions/{sid}/files/data/in.bin").content == payload
    info = httpx.get(f"{gw.url}/sessions/{sid}").json()
    assert info["execution_count"] == 2 and info["status"] == "idle"
    listed = httpx.get(f"{gw.url}/sessions/{sid}/executions").json()["executions"]
    assert [e["id"] for e in listed] == ["2"]  # ids go on; earlier events were not kept
    gone = httpx.get(f"{gw.url}/sessions/{sid}/executions/1/events")
    assert gone.status_code == 410 and gone.json()["error"]["type"] == "execution_expired"


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_an_e2b_sandbox_survives_a_restart(gw: Gateway, how: str) -> None:
    """E2B's SDK holds on to a sandbox across the gateway's restart: same id, same access
    token, its variables, files, metadata and end time, its default contexts' ids; its extra
    context is reported gone."""
    sdk = pytest.importorskip("e2b_code_interpreter")
    exceptions = pytest.importorskip("e2b.exceptions")
    gw.start()
    base = gw.url + "/e2b"
    options = {"api_key": "e2b_00", "api_url": base, "sandbox_url": base}
    sbx = sdk.Sandbox.create(timeout=600, metadata={"owner": how}, **options)
    sbx.run_code("kept = 41")
    sbx.files.write("/home/user/note.txt", "kept too")
    other = sbx.create_code_context()
    defaults = [c.id for c in sbx.list_code_contexts() if c.id != other.id]
    end = sbx.get_info().end_at
    gw.stop(getattr(signal, how))
    gw.start()
    assert sbx.run_code("kept + 1").text == "42"  # the same object: same URL, same token
    assert sbx.files.read("note.txt") == "kept too"
    info = sdk.Sandbox.connect(sbx.sandbox_id, **options).get_info()
    assert info.metadata == {"owner": how} and info.end_at == end
    assert defaults[0] == sbx.sandbox_id  # its own, then the listed defaults (JavaScript)
    assert [c.id for c in sbx.list_code_contexts()] == defaults  # the same ids
    with pytest.raises(exceptions.NotFoundException):
        sbx.run_code("1", context=other)
    records = gw.runtime / gw.instance() / "e2b"
    assert (records / f"{sbx.sandbox_id}.json").stat().st_mode & 0o077 == 0
    sbx.kill()
    deadline = time.monotonic() + 5
    while (records / f"{sbx.sandbox_id}.json").exists():
        assert time.monotonic() < deadline, "a killed sandbox's record stayed"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_hibernated_sessions_survive_a_restart(gw: Gateway, how: str) -> None:
    """A hibernated session is adopted as it was (no kernel, its snapshot and disk kept) and
    resumes on its next call; one resumed onto a warm kernel (running on that kernel's disk,
    carrying its own) is adopted with both disks, and hibernates and resumes again."""
    gw.start("--pool-size", "2")
    gw.wait_for_warm_kernels(2)
    with Client(gw.url, reconnect_seconds=30) as client:
        asleep, carried = client.session(), client.session()
        assert asleep.run("x = 'asleep'").ok and carried.run("y = 'carried'").ok
        asleep.hibernate()
        carried.hibernate()
        gw.wait_for_warm_kernels(1)
        resumed = carried.resume()
        assert resumed is not None and resumed["lost"] == []
        assert gw.record(gw.instance(), carried.id)["carrier"]  # on a warm kernel's disk
        gw.stop(getattr(signal, how))
        gw.start("--pool-size", "2")
        assert asleep.info()["status"] == "hibernated"
        result = asleep.run("print(x)")
        assert result.stdout == "asleep\n" and result.resumed is not None
        assert result.resumed.lost == []
        assert carried.info()["status"] == "idle"
        assert carried.run("print(y)").stdout == "carried\n"
        carried.hibernate()
        assert carried.run("print(y)").stdout == "carried\n"
        asleep.delete()
        carried.delete()
    snapshots = gw.runtime / gw.instance() / "snapshots"
    assert list(snapshots.iterdir()) == []


def test_sessions_of_other_languages_are_adopted_with_their_variables(gw: Gateway) -> None:
    """An R, a TypeScript and a Bash session survive a restart: same kernels, same variables,
    same language; and a language the new gateway no longer serves is reported lost."""
    require_languages("r", "typescript", "bash")
    gw.start()
    cells = {
        "r": ("x <- 41", "cat(x + 1)"),
        "typescript": ("const n: number = 41", "console.log(n + 1)"),
        "bash": ("X=41", "echo $((X+1))"),
    }
    sids = {}
    for language, (assign, _) in cells.items():
        response = httpx.post(gw.url + "/sessions", json={"language": language}, timeout=120)
        assert response.status_code == 201, response.text
        sids[language] = response.json()["id"]
        events, _ = run(gw.url, sids[language], assign)
        assert done(events)["status"] == "ok", events
    gw.restart()
    for language, (_, read) in cells.items():
        info = httpx.get(f"{gw.url}/sessions/{sids[language]}").json()
        assert info["language"] == language, info
        events, _ = run(gw.url, sids[language], read)
        assert stdout(events).strip() == "42", (language, events)
        assert not done(events)["restarted"]
    # Served no more: the session is lost, and says why.
    gw.restart("--languages", "python,r,typescript")
    lost = httpx.get(f"{gw.url}/sessions/{sids['bash']}")
    assert lost.status_code == 410, lost.text
    assert "does not serve its language, bash" in lost.json()["error"]["message"]
    assert httpx.get(f"{gw.url}/sessions/{sids['r']}").status_code == 200
    for language in ("r", "typescript"):
        assert httpx.delete(f"{gw.url}/sessions/{sids[language]}").status_code == 204


def test_the_idle_clock_counts_from_the_last_real_activity(gw: Gateway) -> None:
    gw.start("--idle-timeout", "6")
    sid = httpx.post(gw.url + "/sessions", timeout=60).json()["id"]
    run(gw.url, sid, "x = 1")
    time.sleep(2)
    gw.stop(signal.SIGKILL)
    gw.start("--idle-timeout", "6")
    idle = httpx.get(f"{gw.url}/sessions/{sid}").json()["idle_seconds"]
    assert idle >= 2.0  # not reset by the restart
    deadline = time.monotonic() + 20
    while httpx.get(f"{gw.url}/sessions/{sid}").status_code == 200:
        assert time.monotonic() < deadline, "the adopted session was never reaped"
        time.sleep(0.25)


# -- the cell that was running -----------------------------------------------------------------


COUNTING = (
    "import time\nfor i in range(16):\n    print(i, flush=True)\n    time.sleep(0.5)\ny = 7\n"
)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_cell_running_at_the_stop_finishes_and_its_stream_resumes(gw: Gateway, how: str) -> None:
    gw.start("--drain-timeout", "1")
    sid = httpx.post(gw.url + "/sessions", timeout=60).json()["id"]
    seen: list[tuple[str, dict[str, Any]]] = []
    last_id: list[str] = []

    def stream() -> None:
        try:
            with httpx.stream(
                "POST", f"{gw.url}/sessions/{sid}/execute", json={"code": COUNTING}, timeout=60
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("id: "):
                        last_id.append(line[4:])
                    seen.extend(parse_sse([line, ""]) if line.startswith("data") else [])
        except httpx.HTTPError:
            pass  # cut by the stop

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + 30
    while len(last_id) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    gw.stop(getattr(signal, how))  # SIGTERM: the 1 s drain ends before the cell does
    reader.join(30)
    gw.start()
    info = httpx.get(f"{gw.url}/sessions/{sid}").json()
    listed = httpx.get(f"{gw.url}/sessions/{sid}/executions").json()["executions"]
    assert [e["id"] for e in listed] == ["1"]
    with httpx.stream(
        "GET",
        f"{gw.url}/sessions/{sid}/executions/1/events",
        headers={"Last-Event-ID": last_id[-1]},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        rest = list(parse_sse(response.iter_lines()))
    assert done(rest)["status"] == "ok", rest
    printed = [int(data["text"]) for name, data in rest if name == "stdout"]
    assert printed and printed[-1] == 15 and printed == sorted(set(printed))  # none twice
    assert info["status"] == "busy"
    events, _ = run(gw.url, sid, "print(y)")
    assert stdout(events) == "7\n" and done(events)["execution_count"] == 2


def test_an_adopted_cell_is_still_stopped_at_its_timeout(gw: Gateway) -> None:
    gw.start()
    sid = httpx.post(gw.url + "/sessions", timeout=60).json()["id"]
    run(gw.url, sid, "x = 41")

    def spin() -> None:
        with contextlib.suppress(httpx.HTTPError):  # cut by the SIGKILL
            run(gw.url, sid, "while True: pass", timeout=4)

    threading.Thread(target=spin, daemon=True).start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{gw.url}/sessions/{sid}").json()["status"] != "busy":
        assert time.monotonic() < deadline, "the cell never started"
        time.sleep(0.05)
    time.sleep(0.5)  # sent to the kernel, and its record written
    gw.stop(signal.SIGKILL)
    gw.start()
    started = time.monotonic()
    with httpx.stream("GET", f"{gw.url}/sessions/{sid}/executions/2/events", timeout=60) as r:
        events = list(parse_sse(r.iter_lines()))
    assert done(events)["status"] == "timeout"
    assert time.monotonic() - started < 30  # stopped by its deadline, not left to spin
    events, _ = run(gw.url, sid, "print(x + 1)")
    assert stdout(events) == "42\n"  # interrupted, not restarted: the state is kept


# -- sessions that cannot be adopted -----------------------------------------------------------


def test_a_kernel_that_does_not_answer_or_is_gone_is_reported_lost(gw: Gateway) -> None:
    gw.start()
    frozen, gone, fine = (httpx.post(gw.url + "/sessions", timeout=60).json()["id"] for _ in "abc")
    for sid in (frozen, gone, fine):
        run(gw.url, sid, "x = 41")
    instance = gw.instance()
    gw.stop(signal.SIGKILL)
    client = docker.from_env()
    try:
        lost_kernels = [
            f"kg-{instance}-{gw.record(instance, s)['kernel_id']}" for s in (frozen, gone)
        ]
        client.containers.get(lost_kernels[0]).pause()
        client.containers.get(lost_kernels[1]).kill()
        gw.start()
        for sid in (frozen, gone):
            for method, path in (("GET", ""), ("POST", "/execute"), ("DELETE", "")):
                response = httpx.request(
                    method, f"{gw.url}/sessions/{sid}{path}", json={"code": "1"}, timeout=30
                )
                assert response.status_code == 410, response.text
                assert response.json()["error"]["type"] == "session_lost"
        listed = [s["id"] for s in httpx.get(gw.url + "/sessions").json()["sessions"]]
        assert listed == [fine]
        events, _ = run(gw.url, fine, "print(x + 1)")
        assert stdout(events) == "42\n"
        # One listing call (the models' list inspects each container: one removed meanwhile
        # by another gateway fails it).
        names = {n.lstrip("/") for c in client.api.containers(all=True) for n in c["Names"]}
        kernels = {sid: f"kg-{instance}-{gw.record(instance, sid)['kernel_id']}" for sid in [fine]}
        assert kernels[fine] in names
        assert not any(frozen_or_gone in names for frozen_or_gone in lost_kernels)
        assert not (gw.runtime / instance / "sessions" / f"{frozen}.json").exists()
    finally:
        client.close()


# -- SIGKILL at random moments while clients work ----------------------------------------------


@dataclass
class Tracked:
    values: set[int | None] = field(default_factory=lambda: {None})
    """What `v` may hold (None: unset; more than one when a cell was cut before its done)."""
    maybe_deleted: bool = False


class Worker(threading.Thread):
    """Creates, uses and deletes sessions until told to stop; remembers what it knows."""

    def __init__(self, url: str, seed: int, sessions: dict[str, Tracked]) -> None:
        super().__init__(daemon=True)
        self.url, self.random, self.sessions = url, random.Random(seed), sessions
        self.stopping = threading.Event()
        self.mismatches: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stopping.is_set():
                try:
                    self.step(http)
                except httpx.HTTPError:
                    time.sleep(0.05)  # the gateway is down: this step's outcome is unknown

    def step(self, http: httpx.Client) -> None:
        mine = [s for s, t in self.sessions.items() if not t.maybe_deleted]
        roll = self.random.random()
        if len(mine) < 3 or roll < 0.15:
            response = http.post("/sessions")
            if response.status_code == 201:
                self.sessions[response.json()["id"]] = Tracked()
            return
        sid = self.random.choice(mine)
        tracked = self.sessions[sid]
        if roll < 0.3:
            tracked.maybe_deleted = True
            http.delete(f"/sessions/{sid}")
            return
        value = self.random.randrange(1, 10**9)
        tracked.values.add(value)  # from the moment it is sent, `v` may hold it
        with http.stream(
            "POST", f"/sessions/{sid}/execute", json={"code": f"v = {value}\nprint(v)"}
        ) as r:
            if r.status_code != 200:
                return
            events = list(parse_sse(r.iter_lines()))
        if events and events[-1][0] == "done" and events[-1][1]["status"] == "ok":
            tracked.values = {value}
            if stdout(events) != f"{value}\n":
                self.mismatches.append(f"{sid}: printed {stdout(events)!r}, expected {value}")


def test_sigkill_at_random_moments_loses_no_session_silently(gw: Gateway) -> None:
    seed = int(os.environ.get("KG_TEST_SEED", time.time()))
    print(f"seed {seed}")
    chaos = random.Random(seed)
    owned: list[dict[str, Tracked]] = [{} for _ in range(10)]
    lost = adopted_checks = 0
    # 8 kills at random moments per run (the seed changes each run; KG_CHAOS_ROUNDS=50 for
    # a longer hunt): each round costs a restart, about 8 s.
    for round_ in range(int(os.environ.get("KG_CHAOS_ROUNDS", "8"))):
        gw.start("--max-sessions", "64", "--pool-size", "2")
        # Every session known from before is usable with its variables, or cleanly lost.
        for sessions, sid, tracked in [(o, s, t) for o in owned for s, t in list(o.items())]:
            response = httpx.get(f"{gw.url}/sessions/{sid}", timeout=30)
            if response.status_code == 404 and tracked.maybe_deleted:
                del sessions[sid]
                continue
            if response.status_code == 410:
                assert response.json()["error"]["type"] == "session_lost"
                lost += 1
                del sessions[sid]
                continue
            assert response.status_code == 200, (round_, sid, response.text)
            events, _ = run(gw.url, sid, "print(globals().get('v'))")
            assert done(events)["status"] == "ok", (round_, sid, events)
            value = None if stdout(events) == "None\n" else int(stdout(events))
            assert value in tracked.values, (round_, sid, events, tracked)
            tracked.values = {value}
            adopted_checks += 1
        gw.wait_for_warm_kernels(2)  # so the window below is spent working, not starting
        # Each worker uses only its own sessions: what it knows of them is then exact.
        workers = [Worker(gw.url, seed * 100 + round_ * 10 + i, owned[i]) for i in range(10)]
        for worker in workers:
            worker.start()
        time.sleep(chaos.uniform(1.0, 4.0))
        gw.stop(signal.SIGKILL)
        for worker in workers:
            worker.stopping.set()
        for worker in workers:
            worker.join(60)
            assert not worker.mismatches, worker.mismatches
    print(f"{adopted_checks} adopted sessions checked, {lost} reported lost")
    assert adopted_checks >= 10
    gw.start(persist=False)
    for sid in [s for o in owned for s in o]:
        response = httpx.get(f"{gw.url}/sessions/{sid}", timeout=30)
        assert response.status_code in (200, 404, 410)
    gw.stop()
    assert leftovers(gw) == ([], [], [], [])


def test_a_session_on_a_template_survives_a_restart_and_relaunches_from_it(gw: Gateway) -> None:
    """Adopted with its variables; a kernel that dies afterwards comes back from the
    template's image, not the default one."""
    gw.start()
    started = httpx.post(
        gw.url + "/templates",
        json={
            "name": "durable",
            "steps": [{"type": "RUN", "args": ["echo kept > /opt/mark", "root"]}],
        },
        timeout=60,
    )
    assert started.status_code == 202, started.text
    deadline = time.monotonic() + 180
    while (state := httpx.get(gw.url + "/templates/durable").json()["state"]) == "building":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert state == "ready"
    sid = httpx.post(gw.url + "/sessions", json={"template": "durable"}, timeout=120).json()["id"]
    events, _ = run(gw.url, sid, "x = 41")
    assert done(events)["status"] == "ok"
    gw.restart()
    info = httpx.get(f"{gw.url}/sessions/{sid}").json()
    assert info["template"]["name"] == "durable", info
    events, _ = run(gw.url, sid, "print(x + 1, open('/opt/mark').read().strip())")
    assert stdout(events).split() == ["42", "kept"], events
    events, _ = run(gw.url, sid, "import os; os._exit(1)")
    events, _ = run(gw.url, sid, "print(open('/opt/mark').read().strip())")
    assert stdout(events).strip() == "kept", events
    assert httpx.delete(f"{gw.url}/sessions/{sid}").status_code == 204
    assert httpx.delete(gw.url + "/templates/durable", timeout=60).status_code == 204


def test_keys_and_what_each_owns_survive_a_sigkill(gw: Gateway) -> None:
    """On a gateway without a token a live key still acts as itself (docs/keys.md): its
    session stays its own, and refused to another key, across a SIGKILL."""
    gw.start()
    keys = {
        name: httpx.post(f"{gw.url}/keys", json={"name": name}, timeout=30).json()
        for name in ("alice", "bob")
    }
    alice = {"Authorization": f"Bearer {keys['alice']['secret']}"}
    bob = {"Authorization": f"Bearer {keys['bob']['secret']}"}
    sid = httpx.post(gw.url + "/sessions", headers=alice, timeout=60).json()["id"]
    ran = httpx.post(
        f"{gw.url}/sessions/{sid}/execute",
        json={"code": "x = 'kept'"},
        headers={**alice, "Accept": "application/json"},
        timeout=60,
    )
    assert ran.status_code == 200, ran.text
    gw.stop(signal.SIGKILL)
    gw.start()
    assert httpx.get(f"{gw.url}/sessions/{sid}", headers=bob, timeout=30).status_code == 404
    assert httpx.get(f"{gw.url}/sessions", headers=bob, timeout=30).json() == {"sessions": []}
    mine = httpx.get(f"{gw.url}/sessions/{sid}", headers=alice, timeout=30).json()
    assert mine["owner"] == keys["alice"]["id"]
    again = httpx.post(
        f"{gw.url}/sessions/{sid}/execute",
        json={"code": "print(x)"},
        headers={**alice, "Accept": "application/json"},
        timeout=60,
    ).json()
    assert again["stdout"] == "kept\n"
    assert httpx.delete(f"{gw.url}/sessions/{sid}", headers=alice, timeout=60).status_code == 204


def test_a_chat_conversation_survives_a_sigkill(gw: Gateway) -> None:
    """The conversation is written after every step: a SIGKILLed gateway's successor has it,
    and its model reads it (and the variable the model's cell made is still there)."""

    def script(request: dict[str, Any]) -> Reply:
        asked, output = last_user_text(request), last_tool_output(request)
        if "remember" in asked:
            return Reply(code=["kept = 41"]) if output is None else Reply(text="Kept it.")
        if output is None:
            return Reply(code=["print(kept + 1)"])
        return Reply(text=f"{len(request['messages'])} messages; {output.strip()}")

    def ask(sid: str, message: str) -> dict[str, Any]:
        with httpx.stream(
            "POST", f"{gw.url}/sessions/{sid}/chat", json={"message": message}, timeout=120
        ) as response:
            assert response.status_code == 200, response.read()
            events = list(parse_sse(response.iter_bytes()))
        assert events[-1][0] == "end", events
        return events[-1][1]

    with ScriptedModel(script) as model:
        flags = ("--llm-url", model.url, "--llm-model", "scripted")
        gw.start(*flags)
        sid = httpx.post(gw.url + "/sessions", timeout=60).json()["id"]
        assert ask(sid, "remember 41")["status"] == "answered"
        saved = gw.runtime / gw.instance() / "chats" / f"{sid}.json"
        deadline = time.monotonic() + 10
        while "Kept it." not in (saved.read_text() if saved.exists() else ""):
            assert time.monotonic() < deadline, "the conversation was never written"
            time.sleep(0.05)
        gw.stop(signal.SIGKILL)
        gw.start(*flags)
        history = httpx.get(f"{gw.url}/sessions/{sid}/chat", timeout=30).json()
        assert [(t["message"], t["status"]) for t in history["turns"]] == [
            ("remember 41", "answered")
        ]
        end = ask(sid, "what was it, plus one?")
        # system, the first turn (user, assistant's call, tool, answer), this turn's user
        # message, its call and the call's output
        assert end["text"] == "8 messages; 42", end
        httpx.delete(f"{gw.url}/sessions/{sid}", timeout=60)
        gw.stop()

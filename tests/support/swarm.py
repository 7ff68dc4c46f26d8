"""A real multi-node Docker Swarm on this one machine, torn down completely afterwards.

    with Swarm.start(workers=2, images=["kernel-gateway-kernel:latest"]) as swarm:
        swarm.cli(swarm.manager, "service", "create", ...)
        swarm.kill_node(swarm.workers[0])

The manager is the machine's ordinary engine (/var/run/docker.sock): it is put in swarm
mode for the fixture's life and taken out of it at `stop()`. Each worker is another
`dockerd` started as

    ip netns exec kgsw-w1 unshare --mount --uts --pid --fork --mount-proc --kill-child \\
        docker-init -- sh -c '<mounts>; exec dockerd ...'

so a worker has its own network namespace (a veth on the bridge `kgsw0`, address
10.201.0.2, ...), its own mounts, its own host name (`w1`) and its own PID namespace
whose init is `docker-init`: SIGKILL to that one process kills the worker's engine, its
containerd, every shim and every container process at once (`kill_node`, and the last
step of `stop`). Nothing else is needed to stop a node.

How the known traps of a swarm on one machine are handled:

1. One filesystem for every node. NODE_ROOT (/run/kg-node) is the same path string on every
   node and a different folder on each: on the host (the manager) it is a real folder whose
   `docker.sock` is a symlink to the manager's socket; in each worker's mount namespace a
   host folder (/run/kg-swarm/w1/node, `Node.root`) is bind-mounted on it and the worker's
   engine listens on `{NODE_ROOT}/docker.sock` there, so the host reaches that engine at
   `{Node.root}/docker.sock` (`Node.docker_host`). Bind sources in a service spec such as
   f"{NODE_ROOT}/docker.sock" or f"{NODE_ROOT}/kernel-gateway" resolve to the node's own
   socket and folder. Each worker's /var/run/docker.sock is also covered by its own socket
   (a bind mount in its namespace), and its /etc/docker (trust key, daemon.json) and
   /run/containerd (shim sockets) are private folders: nothing of the manager's is shared.
   Every mount a worker's namespace inherited from the host (the manager's container
   mounts, other netns files, loop-mounted workspaces) is lazily unmounted in that namespace
   so that a worker pins nothing of the host's.
2. Worker-to-worker traffic dropped by Docker's FORWARD rules: `iptables -I DOCKER-USER -i
   kgsw0 -o kgsw0 -j ACCEPT`, removed at stop.
3. Workers looking up the registry: /etc/netns/<ns>/resolv.conf says `nameserver
   127.0.0.1` (nothing listens: the lookup fails at once) and no namespace has a default
   route.
4. Encrypted overlays do not carry traffic here: use plain overlays.
5. No IPVS: use `--endpoint-mode dnsrr` and `--publish mode=host`. Host-mode ports work on
   the workers although their engines run with `--iptables=false`: the userland proxy
   (docker-proxy, on by default) listens in the worker's namespace.

One swarm fixture runs on a machine at a time (its manager is the machine's engine): an
abstract-socket lock, which the kernel releases however its holder dies, makes a second
`start` wait. A run that died (SIGKILL) leaves its namespaces and engines behind; the next
`start` removes them first (from the state file it keeps in STATE_ROOT and by name).
The core has no pytest dependency (bench/ imports it). `python -m tests.support.swarm
leftovers|cleanup` lists or removes what a killed test run left behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import docker

log = logging.getLogger(__name__)

PREFIX = "kgsw"
NODE_ROOT = "/run/kg-node"  # same path on every node, a different folder on each (trap 1)
STATE_ROOT = "/run/kg-swarm"  # host side: worker node folders, engine logs, the state file
DATA_ROOT = "/var/lib/kg-swarm"  # worker engines' data roots (images, containers)
MANAGER_SOCKET = "/var/run/docker.sock"
BRIDGE = f"{PREFIX}0"
STATE_FILE = f"{STATE_ROOT}/state.json"
NETNS_DIR = "/run/netns"
ETC_NETNS = "/etc/netns"
CONTAINERD_RUN = "/run/containerd"
ETC_DOCKER = "/etc/docker"
GWBRIDGE = "docker_gwbridge"
SWARM_PORT = 2377
# One swarm fixture per machine (it uses the machine's engine as its manager): the lock is
# an abstract unix socket, released by the kernel however its owner dies.
LOCK_ADDRESS = b"\0kg-swarm-fixture-lock"
CANDIDATE_SUBNETS = [ipaddress.IPv4Network(f"10.201.{i}.0/24") for i in range(256)]
TASK_LABEL = "com.docker.swarm.task.id"


class SwarmError(RuntimeError):
    """The swarm could not be brought up (or a precondition does not hold)."""


class CommandError(subprocess.CalledProcessError):
    """A command failed; unlike CalledProcessError its message carries its stderr."""

    def __str__(self) -> str:
        err = self.stderr if isinstance(self.stderr, str) else ""
        return f"{shlex.join(str(a) for a in self.cmd)} exited {self.returncode}: {err.strip()}"


def run(
    *cmd: str, check: bool = True, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output as text; raise CommandError on failure if check."""
    proc = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, input=input, check=False
    )
    if check and proc.returncode != 0:
        raise CommandError(proc.returncode, list(cmd), proc.stdout, proc.stderr)
    return proc


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2
) -> float:
    """Poll predicate until it is true; return the seconds it took, raise TimeoutError."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


@dataclass
class Node:
    name: str  # "manager", "w1", "w2"
    address: str  # its address on the test bridge (the manager: the bridge's host side)
    docker_host: str  # its engine, as a -H / base_url usable from the host
    node_id: str  # swarm node id
    pid: int | None  # the worker engine's (dockerd's) pid; None for the manager
    root: str = NODE_ROOT  # where this node's NODE_ROOT folder is seen from the host
    netns: str | None = None  # the worker's network namespace (None for the manager)
    init_pid: int | None = None  # the worker's PID-namespace init (docker-init), host pid
    alive: bool = True  # False once kill_node() killed it

    @property
    def is_manager(self) -> bool:
        return self.netns is None


@dataclass
class _Made:
    """What start() made, persisted to STATE_FILE as it goes so a later run can undo it."""

    owner_pid: int = field(default_factory=os.getpid)
    subnet: str | None = None
    host_address: str | None = None
    bridge: bool = False
    iptables_rule: bool = False
    netns: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    made_netns_dir: bool = False  # /run/netns did not exist before start
    made_netns_mount: bool = False  # `ip netns add` made /run/netns a bind mount of itself
    made_etc_netns: bool = False
    made_containerd_run: bool = False
    made_etc_docker: bool = False
    gwbridge_existed: bool = True  # docker_gwbridge existed on the manager before start
    swarm_init: bool = False
    init_pids: list[int] = field(default_factory=list)

    def save(self) -> None:
        Path(STATE_ROOT).mkdir(parents=True, exist_ok=True)
        tmp = Path(STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(STATE_FILE)

    @classmethod
    def load(cls) -> _Made | None:
        try:
            data = json.loads(Path(STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class _Engine:
    """A running worker engine: `unshare` (our child) and its child, the namespace init."""

    node: Node
    proc: subprocess.Popen[bytes]
    init_fd: int  # a pidfd on the namespace init: signals reach that process or none
    log_path: Path


class Swarm:
    NODE_ROOT = NODE_ROOT

    def __init__(self) -> None:
        self.manager: Node
        self.workers: list[Node] = []
        self.timings: dict[str, float] = {}
        self._made = _Made()
        self._engines: dict[str, _Engine] = {}
        self._clients: dict[str, docker.DockerClient] = {}
        self._lock: socket.socket | None = None
        self._stopped = False

    # -- public -----------------------------------------------------------------------------

    @property
    def nodes(self) -> list[Node]:
        return [self.manager, *self.workers]

    @classmethod
    def start(
        cls,
        workers: int = 2,
        images: Sequence[str] = (),
        *,
        heartbeat: float | None = None,
        engine_timeout: float = 60,
        lock_wait: float = 300,
    ) -> Swarm:
        """Bring up a swarm of the manager and `workers` worker engines; copy `images` to
        every worker. `heartbeat` (seconds) sets the swarm's dispatcher heartbeat (Docker's
        default, 5 s, marks a dead node Down after ~10-15 s). One swarm runs on a machine at a
        time (its manager is the machine's engine): start waits up to `lock_wait` seconds
        for another one to stop. On any failure everything made so far is torn down before
        the error propagates."""
        if workers < 0 or workers > 250:
            raise ValueError("workers must be between 0 and 250")
        swarm = cls()
        try:
            swarm._bring_up(workers, list(images), heartbeat, engine_timeout, lock_wait)
        except BaseException:
            swarm.stop()
            raise
        return swarm

    def __enter__(self) -> Swarm:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def cli(
        self,
        node: Node,
        *args: str,
        check: bool = True,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`docker -H node.docker_host *args`, output captured as text."""
        return run(
            "docker", "-H", node.docker_host, *args, check=check, timeout=timeout, input=input
        )

    def node_shell(
        self, node: Node, script: str, *, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`sh -c script` as a process of the node: for a worker, in its mount, UTS,
        network and PID namespaces (so NODE_ROOT is that node's folder); for the manager,
        on the host. On a killed worker it fails (CommandError with check)."""
        if node.is_manager:
            return run("sh", "-c", script, check=check, timeout=timeout)
        if not node.alive or node.init_pid is None:
            cmd = ["sh", "-c", script]
            if check:
                raise CommandError(255, cmd, "", f"node {node.name} is dead")
            return subprocess.CompletedProcess(cmd, 255, "", f"node {node.name} is dead")
        return run(
            "nsenter", "--target", str(node.init_pid), "--mount", "--uts", "--net", "--pid",
            "sh", "-c", script, check=check, timeout=timeout,
        )  # fmt: skip

    def client(self, node: Node) -> docker.DockerClient:
        """A Docker SDK client for the node's engine (cached; closed by stop())."""
        if node.name not in self._clients:
            self._clients[node.name] = docker.DockerClient(base_url=node.docker_host, timeout=60)
        return self._clients[node.name]

    def node_state(self, node: Node) -> str:
        """The manager's view of the node: "ready", "down", "unknown", "disconnected"."""
        out = self.cli(
            self.manager, "node", "inspect", "--format", "{{.Status.State}}", node.node_id
        )
        return out.stdout.strip()

    def wait_node_state(self, node: Node, state: str, timeout: float = 60) -> float:
        """Wait until the manager reports the node in `state`; return the seconds it took."""
        return wait_until(
            lambda: self.node_state(node) == state, timeout, f"node {node.name} {state}", 0.25
        )

    def running_tasks(self, service: str) -> list[str]:
        """Host names of the nodes where the service's tasks run now (one per task)."""
        out = self.cli(
            self.manager,
            "service",
            "ps",
            service,
            "--filter",
            "desired-state=running",
            "--format",
            "{{.Node}} {{.CurrentState}}",
            "--no-trunc",
            check=False,
        )
        running = [line.split()[0] for line in out.stdout.splitlines() if " Running " in line]
        return running

    def wait_tasks(self, service: str, count: int, timeout: float = 120) -> float:
        """Wait until `count` tasks of the service run; return the seconds it took."""
        return wait_until(
            lambda: len(self.running_tasks(service)) >= count,
            timeout,
            f"{count} running tasks of {service}",
            0.25,
        )

    def makedirs(self, relative: str, mode: int = 0o755) -> None:
        """Make f"{NODE_ROOT}/{relative}" on every node (e.g. a bind source of a stack)."""
        for node in self.nodes:
            path = Path(node.root, relative)
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)

    def copy_images(self, images: Sequence[str], nodes: Sequence[Node] | None = None) -> float:
        """Copy images from the manager to the given (default: every live) worker: one
        `docker save` streamed to a `docker load` per worker, all at once. Returns seconds."""
        chosen = self.workers if nodes is None else nodes
        targets = [n for n in chosen if n.alive and not n.is_manager]
        if not images or not targets:
            return 0.0
        started = time.monotonic()
        _stream_save_load(self.manager.docker_host, [n.docker_host for n in targets], images)
        return time.monotonic() - started

    def kill_node(self, node: Node, unplug: bool = False) -> None:
        """The worker machine dies: SIGKILL to its PID namespace's init, which kills its
        engine, its containerd, every shim and container process at once. Its address then
        refuses connections (the namespace's network stack remains, with nothing listening);
        with `unplug=True` its link goes down first and its address stops answering
        (connections time out) as a powered-off machine's would."""
        if node.is_manager:
            raise ValueError("the manager cannot be killed (it is this machine's engine)")
        engine = self._engines[node.name]
        if unplug:
            run("ip", "link", "set", _veth(node.name), "down", check=False)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(engine.init_fd, signal.SIGKILL)
        engine.proc.wait(timeout=30)
        node.alive = False
        client = self._clients.pop(node.name, None)
        if client is not None:
            client.close()

    def stop(self, grace: float = 1.0) -> None:
        """Tear down everything start() made. Idempotent; never raises for a failed step
        (each is logged; `leftovers()` tells what remains). Worker engines get SIGTERM and,
        `grace` seconds later, their namespaces' inits SIGKILL: a graceful dockerd shutdown
        in swarm mode takes ~8 s here (it waits 5 s for the ingress network) and saves
        nothing, since the node's data root is deleted anyway."""
        if self._stopped:
            return
        self._stopped = True
        if self._lock is None:  # never owned the machine's swarm (another fixture runs)
            return
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        _teardown(self._made, list(self._engines.values()), grace)
        self._engines.clear()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        remaining = self.leftovers()
        if remaining:
            log.warning("swarm teardown left: %s", "; ".join(remaining))

    def leftovers(self) -> list[str]:
        """Anything of the swarm left on this machine, human readable; [] when clean."""
        found = leftovers()
        made = self._made
        if made.made_netns_mount and _is_mount(NETNS_DIR):
            found.append(f"{NETNS_DIR} is still a mount (ip netns made it)")
        if made.made_netns_dir and os.path.exists(NETNS_DIR):
            found.append(f"{NETNS_DIR} (made by ip netns)")
        if made.made_etc_netns and os.path.exists(ETC_NETNS):
            found.append(f"{ETC_NETNS} (made by start)")
        if made.made_containerd_run and os.path.exists(CONTAINERD_RUN):
            found.append(f"{CONTAINERD_RUN} (made by start)")
        if made.made_etc_docker and os.path.exists(ETC_DOCKER):
            found.append(f"{ETC_DOCKER} (made by start)")
        if made.swarm_init and not made.gwbridge_existed and _manager_has_network(GWBRIDGE):
            found.append(f"network {GWBRIDGE} on the manager (made by the swarm)")
        return found

    # -- bring-up ---------------------------------------------------------------------------

    def _bring_up(
        self,
        workers: int,
        images: list[str],
        heartbeat: float | None,
        engine_timeout: float,
        lock_wait: float,
    ) -> None:
        t0 = time.monotonic()
        self._preflight(images, lock_wait)
        made = self._made

        # Host side: the bridge, the manager's NODE_ROOT, the worker namespaces.
        subnet = _free_subnet()
        hosts = list(subnet.hosts())
        made.subnet = str(subnet)
        made.host_address = str(hosts[0])
        made.gwbridge_existed = _manager_has_network(GWBRIDGE)
        made.made_netns_dir = not os.path.exists(NETNS_DIR)
        made.made_netns_mount = not _is_mount(NETNS_DIR)
        made.made_etc_netns = not os.path.exists(ETC_NETNS)
        made.made_containerd_run = not os.path.exists(CONTAINERD_RUN)
        made.made_etc_docker = not os.path.exists(ETC_DOCKER)
        made.save()
        Path(CONTAINERD_RUN).mkdir(mode=0o711, exist_ok=True)
        Path(ETC_DOCKER).mkdir(mode=0o755, exist_ok=True)
        Path(NODE_ROOT).mkdir(mode=0o755)
        os.symlink(MANAGER_SOCKET, f"{NODE_ROOT}/docker.sock")
        made.bridge = True
        made.save()
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{made.host_address}/{subnet.prefixlen}", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        if run("iptables", "-n", "-L", "DOCKER-USER", check=False).returncode == 0:
            made.iptables_rule = True
            made.save()
            run("iptables", "-I", "DOCKER-USER", *_IPTABLES_RULE)
        else:
            log.warning("no DOCKER-USER chain: worker-to-worker traffic may be dropped")
        self.manager = Node(
            name="manager",
            address=made.host_address,
            docker_host=f"unix://{MANAGER_SOCKET}",
            node_id="",
            pid=None,
        )
        for i in range(workers):
            name = f"w{i + 1}"
            self.workers.append(self._make_namespace(name, str(hosts[i + 1]), subnet.prefixlen))
        self.timings["network"] = time.monotonic() - t0

        # Worker engines, all at once.
        t1 = time.monotonic()
        for node in self.workers:
            self._engines[node.name] = self._launch_engine(node)
        for node in self.workers:
            self._await_engine(self._engines[node.name], engine_timeout)
        self.timings["engines"] = time.monotonic() - t1

        # The swarm.
        t2 = time.monotonic()
        init = ["swarm", "init", "--advertise-addr", made.host_address]
        init += ["--listen-addr", f"{made.host_address}:{SWARM_PORT}"]
        if heartbeat is not None:
            init += ["--dispatcher-heartbeat", f"{heartbeat:g}s"]
        made.swarm_init = True
        made.save()
        self.cli(self.manager, *init)
        self.manager.node_id = self._swarm_node_id(self.manager)
        token = self.cli(self.manager, "swarm", "join-token", "-q", "worker").stdout.strip()
        for node in self.workers:
            self.cli(
                node,
                "swarm",
                "join",
                "--token",
                token,
                "--advertise-addr",
                node.address,
                "--listen-addr",
                f"{node.address}:{SWARM_PORT}",
                f"{made.host_address}:{SWARM_PORT}",
            )
            node.node_id = self._swarm_node_id(node)
        wait_until(self._all_ready, 60, "every node Ready")
        for node in self.nodes:
            self.cli(
                self.manager, "node", "update", "--label-add", f"kg.node={node.name}", node.node_id
            )
        self.timings["swarm"] = time.monotonic() - t2
        self.timings["bring_up"] = time.monotonic() - t0

        t3 = time.monotonic()
        self.copy_images(images)
        self.timings["images"] = time.monotonic() - t3
        log.info("swarm up: %s", {k: round(v, 2) for k, v in self.timings.items()})

    def _preflight(self, images: list[str], lock_wait: float) -> None:
        self._lock = _take_lock(lock_wait)
        reason = cluster_unavailable_reason()
        if reason is not None:
            raise SwarmError(reason)
        stale = _Made.load()
        remaining = leftovers()
        if stale is not None or remaining:
            log.warning("cleaning up what an earlier swarm fixture left: %s", remaining)
            _teardown(stale or _Made(), [])
            remaining = leftovers()
            if remaining:
                raise SwarmError(f"an earlier swarm fixture left things behind: {remaining}")
        for image in images:
            if run(
                "docker", "image", "inspect", "--format", "{{.Id}}", image, check=False
            ).returncode:
                raise SwarmError(f"image {image} is not on the manager engine")

    def _make_namespace(self, name: str, address: str, prefixlen: int) -> Node:
        made = self._made
        ns, veth = _netns(name), _veth(name)
        made.netns.append(ns)
        made.veths.append(veth)
        made.save()
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", veth, "master", BRIDGE, "up")
        run("ip", "-n", ns, "addr", "add", f"{address}/{prefixlen}", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        # Trap 3: a resolver that fails at once; and no default route.
        etc = Path(ETC_NETNS, ns)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        state = Path(STATE_ROOT, name)
        for sub in ("node", "etc-docker", "exec"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        (state / "node").chmod(0o755)
        Path(DATA_ROOT, name).mkdir(parents=True, exist_ok=True)
        (state / "etc-docker" / "daemon.json").write_text(
            json.dumps(_worker_daemon_json(), indent=1)
        )
        root = str(state / "node")
        return Node(
            name=name,
            address=address,
            docker_host=f"unix://{root}/docker.sock",
            node_id="",
            pid=None,
            root=root,
            netns=ns,
        )

    def _launch_engine(self, node: Node) -> _Engine:
        assert node.netns is not None
        init = _init_binary()
        assert init is not None
        log_path = Path(STATE_ROOT, node.name, "engine.log")
        argv = [
            "ip", "netns", "exec", node.netns,
            "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child",
            init, "--", "sh", "-c", _engine_script(node.name), _marker(node.name),
        ]  # fmt: skip
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            init_pid = _wait_child(proc.pid, 10)
            init_fd = os.pidfd_open(init_pid)
            if _ppid(init_pid) != proc.pid:  # it died and the pid was reused meanwhile
                os.close(init_fd)
                raise SwarmError(f"worker {node.name}: its namespace init died at once")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        node.init_pid = init_pid
        self._made.init_pids.append(init_pid)
        self._made.save()
        return _Engine(node=node, proc=proc, init_fd=init_fd, log_path=log_path)

    def _await_engine(self, engine: _Engine, timeout: float) -> None:
        node = engine.node
        sock = f"{node.root}/docker.sock"

        def answers() -> bool:
            if engine.proc.poll() is not None:
                raise SwarmError(f"worker {node.name}'s engine exited:\n{_tail(engine.log_path)}")
            if not os.path.exists(sock):
                return False
            return (
                run("docker", "-H", node.docker_host, "version", check=False, timeout=10).returncode
                == 0
            )

        try:
            wait_until(answers, timeout, f"worker {node.name}'s engine", 0.1)
        except TimeoutError as exc:
            raise SwarmError(f"{exc}\n{_tail(engine.log_path)}") from None
        assert node.init_pid is not None
        children = _children(node.init_pid)
        node.pid = children[0] if children else None
        # The node's /var/run/docker.sock is its own engine too (in its mount namespace).
        run(
            "nsenter", "--target", str(node.init_pid), "--mount",
            "mount", "--bind", f"{NODE_ROOT}/docker.sock", MANAGER_SOCKET,
        )  # fmt: skip

    def _swarm_node_id(self, node: Node) -> str:
        return self.cli(node, "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()

    def _all_ready(self) -> bool:
        out = self.cli(self.manager, "node", "ls", "--format", "{{.ID}} {{.Status}}")
        ready = {line.split()[0] for line in out.stdout.splitlines() if line.endswith(" Ready")}
        return all(n.node_id in ready for n in self.nodes)


# -- helpers --------------------------------------------------------------------------------

_IPTABLES_RULE = ["-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]
# The programs of a worker node seen from the host (a `tail` of its log is not one of them).
_NODE_PROGRAMS = {
    "ip", "unshare", "nsenter", "docker-init", "tini", "sh", "dockerd", "containerd",
    "containerd-shim", "containerd-shim-runc-v2", "docker-proxy", "runc", "docker",
}  # fmt: skip
# Mounts a worker keeps from the host's mount table; the rest is lazily unmounted there.
_KEEP_MOUNTS = "/ | /proc | /proc/* | /sys | /sys/* | /dev | /dev/* | /etc/*"


def _netns(name: str) -> str:
    return f"{PREFIX}-{name}"


def _veth(name: str) -> str:
    return f"{PREFIX}-{name}h"


def _marker(name: str) -> str:
    return f"{PREFIX}-node-{name}"


def _init_binary() -> str | None:
    return shutil.which("docker-init") or shutil.which("tini")


def _worker_daemon_json() -> dict[str, Any]:
    """A worker's daemon.json: the manager's runtimes (runsc, ...) and nothing else."""
    try:
        host = json.loads(Path(ETC_DOCKER, "daemon.json").read_text() or "{}")
    except (OSError, ValueError):
        host = {}
    return {"runtimes": host["runtimes"]} if isinstance(host, dict) and "runtimes" in host else {}


def _engine_script(name: str) -> str:
    """The shell run as the worker namespace's first process's child: set the host name,
    drop the host's mounts, mount cgroups and the node's private folders, exec dockerd."""
    q = shlex.quote
    state = f"{STATE_ROOT}/{name}"
    lines = [
        "set -e",
        f"echo {q(name)} > /proc/sys/kernel/hostname",
        # Lazily unmount what the namespace inherited (the manager's container mounts, netns
        # files, loop-mounted workspaces...) so that this node pins nothing of the host's.
        # (Read whole first: the table changes as the loop unmounts. Paths with spaces are
        # \040-escaped there, so word splitting is safe; such a path just stays mounted.)
        "for m in $(awk '{print $2}' /proc/self/mounts); do",
        f'  case "$m" in {_KEEP_MOUNTS}) ;; *) umount -l "$m" 2>/dev/null || true ;; esac',
        "done",
    ]
    # `ip netns exec` remounted /sys, which hides the cgroup hierarchies: mount them again.
    for src, target, fstype, opts in _cgroup_mounts():
        lines.append(f"mkdir -p {q(target)}")
        lines.append(f"mount -t {q(fstype)} -o {q(opts)} {q(src)} {q(target)}")
    lines += [
        f"mount --bind {q(state + '/node')} {q(NODE_ROOT)}",
        f"mount --bind {q(state + '/etc-docker')} {q(ETC_DOCKER)}",
        f"mount -t tmpfs -o mode=0711 {PREFIX}-containerd {q(CONTAINERD_RUN)}",
        "exec "
        + shlex.join(
            [
                "dockerd",
                "--data-root",
                f"{DATA_ROOT}/{name}",
                "--exec-root",
                f"{state}/exec",
                "--pidfile",
                f"{state}/dockerd.pid",
                "-H",
                f"unix://{NODE_ROOT}/docker.sock",
                "--cgroup-parent",
                f"{PREFIX}-{name}",
                "--iptables=false",
                "--bridge=none",
            ]
        ),  # fmt: skip
    ]
    return "\n".join(lines)


def _mount_targets() -> list[str]:
    """Mount points of this mount namespace (os.path.ismount misses a folder bind-mounted
    on itself, as `ip netns add` does with /run/netns)."""
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [line.split()[1].replace("\\040", " ") for line in lines]


def _is_mount(path: str) -> bool:
    return path in _mount_targets()


def _cgroup_mounts() -> list[tuple[str, str, str, str]]:
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        src, target, fstype, opts = line.split()[:4]
        if target == "/sys/fs/cgroup" or target.startswith("/sys/fs/cgroup/"):
            found.append((src, target, fstype, opts))
    return found


def _free_subnet() -> ipaddress.IPv4Network:
    used: list[ipaddress.IPv4Network] = []
    for entry in json.loads(run("ip", "-j", "addr", "show").stdout):
        for addr in entry.get("addr_info", []):
            if addr.get("family") == "inet":
                used.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", False))
    for route in json.loads(run("ip", "-j", "route", "show", "table", "all").stdout):
        dst = route.get("dst", "")
        if dst and dst != "default" and ":" not in dst:
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", False))
    for subnet in CANDIDATE_SUBNETS:
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise SwarmError("no free 10.201.x.0/24 subnet on this machine")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _wait_child(pid: int, timeout: float) -> int:
    found: list[int] = []

    def forked() -> bool:
        found[:] = _children(pid)
        return bool(found)

    wait_until(forked, timeout, f"unshare ({pid}) forking the namespace init", 0.01)
    return found[0]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no engine log)"


def _stream_save_load(source: str, targets: list[str], images: Sequence[str]) -> None:
    """One `docker save` of the images, streamed to a `docker load` on each target."""
    save = subprocess.Popen(
        ["docker", "-H", source, "save", *images], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    loads = [
        subprocess.Popen(
            ["docker", "-H", target, "load", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for target in targets
    ]
    assert save.stdout is not None
    failed: list[str] = []
    try:
        while chunk := save.stdout.read(1 << 20):
            for load in loads:
                assert load.stdin is not None
                load.stdin.write(chunk)
    except BrokenPipeError:
        failed.append("a docker load stopped reading")
    finally:
        save.stdout.close()
        for load in loads:
            assert load.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                load.stdin.close()
    _, save_err = save.communicate(timeout=600)
    if save.returncode:
        failed.append(f"docker save: {save_err.decode(errors='replace').strip()}")
    for target, load in zip(targets, loads, strict=True):
        assert load.stderr is not None
        err = load.stderr.read()
        load.stderr.close()
        if load.wait(timeout=600):
            failed.append(f"docker load on {target}: {err.decode(errors='replace').strip()}")
    if failed:
        raise SwarmError("copying images failed: " + "; ".join(failed))


def _manager(
    *args: str, check: bool = False, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return run("docker", "-H", f"unix://{MANAGER_SOCKET}", *args, check=check, timeout=timeout)


def _manager_has_network(name: str) -> bool:
    return _manager("network", "inspect", "--format", "{{.Name}}", name).returncode == 0


def _manager_swarm() -> dict[str, Any]:
    out = _manager("info", "--format", "{{json .Swarm}}")
    if out.returncode != 0:
        return {}
    data = json.loads(out.stdout)
    return data if isinstance(data, dict) else {}


def _our_processes() -> list[tuple[int, str]]:
    """Processes of worker nodes: by their marker, data root or state folder."""
    markers = (f"{STATE_ROOT}/", f"{DATA_ROOT}/", f"--data-root={DATA_ROOT}", f"{PREFIX}-node-")
    me = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in me:
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if os.path.basename(args[0]) in _NODE_PROGRAMS and any(a.startswith(markers) for a in args):
            found.append((int(entry.name), " ".join(args).strip()))
    return found


def _cgroup_dirs() -> list[Path]:
    """Cgroup folders of worker engines (their --cgroup-parent), deepest first."""
    found: list[Path] = []
    base = Path("/sys/fs/cgroup")
    if not base.is_dir():
        return found
    for hierarchy in base.iterdir():
        for dirpath, dirnames, _ in os.walk(hierarchy):
            depth = len(Path(dirpath).relative_to(hierarchy).parts)
            ours = [d for d in dirnames if d.startswith(f"{PREFIX}-")]
            for d in ours:
                for sub, _, _ in os.walk(Path(dirpath, d), topdown=False):
                    found.append(Path(sub))
            dirnames[:] = [d for d in dirnames if d not in ours] if depth < 3 else []
    return found


def leftovers() -> list[str]:
    """Anything a swarm fixture leaves on this machine (by its names); [] when clean."""
    found: list[str] = []
    for pid, cmd in _our_processes():
        found.append(f"process {pid}: {cmd[:160]}")
    netns = run("ip", "netns", "list", check=False).stdout.split()
    found += [f"netns {n}" for n in netns if n.startswith(f"{PREFIX}-")]
    links = json.loads(run("ip", "-j", "link", "show").stdout or "[]")
    found += [f"link {li['ifname']}" for li in links if li.get("ifname", "").startswith(PREFIX)]
    rules = run("iptables-save", check=False).stdout.splitlines()
    found += [f"iptables rule: {r}" for r in rules if BRIDGE in r.split()]
    if os.path.isdir(ETC_NETNS):
        found += [f"{ETC_NETNS}/{d}" for d in os.listdir(ETC_NETNS) if d.startswith(f"{PREFIX}-")]
    for target in _mount_targets():
        if target.startswith((NODE_ROOT, STATE_ROOT, DATA_ROOT, f"{NETNS_DIR}/{PREFIX}-")):
            found.append(f"mount {target}")
    found += [f"path {p}" for p in (NODE_ROOT, STATE_ROOT, DATA_ROOT) if os.path.lexists(p)]
    found += [f"cgroup {d}" for d in _cgroup_dirs()]
    swarm = _manager_swarm()
    if swarm.get("LocalNodeState", "inactive") != "inactive":
        found.append(
            f"the manager engine is in swarm mode ({swarm.get('LocalNodeState')}, "
            f"node address {swarm.get('NodeAddr')})"
        )
    tasks = _manager("ps", "-aq", "--filter", f"label={TASK_LABEL}").stdout.split()
    found += [f"swarm task container {c} on the manager" for c in tasks]
    return found


def _teardown(made: _Made, engines: list[_Engine], grace: float = 1.0) -> None:
    """Undo what `made` records (and anything by our names), step by step, each step
    logged and skipped on failure. Used by stop() and to clean up after a dead run."""

    def step(what: str, fn: Callable[..., object], *args: Any) -> None:
        started = time.monotonic()
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - every step runs whatever the others did
            log.warning("swarm teardown: %s failed: %s", what, exc)
        log.debug("swarm teardown: %s: %.2f s", what, time.monotonic() - started)

    swarm = _manager_swarm()
    ours = made.swarm_init and swarm.get("NodeAddr") == made.host_address
    ours = ours and swarm.get("LocalNodeState", "inactive") != "inactive"
    if ours:
        step("removing services", _remove_services)
    step("stopping worker engines", _stop_engines, engines, grace)
    step("killing worker processes", _kill_strays)
    if ours:
        step("swarm leave", _leave_swarm)
    if made.swarm_init and not made.gwbridge_existed:
        step("removing docker_gwbridge", _remove_gwbridge)
    step("removing cgroups", _remove_cgroups)
    for veth in sorted(set(made.veths) | _links_named(f"{PREFIX}-")):
        step(f"deleting {veth}", _link_del, veth)
    names = set(made.netns) | {
        n
        for n in run("ip", "netns", "list", check=False).stdout.split()
        if n.startswith(f"{PREFIX}-")
    }
    for ns in sorted(names):
        step(f"deleting netns {ns}", _netns_del, ns)
        step(f"removing {ETC_NETNS}/{ns}", shutil.rmtree, Path(ETC_NETNS, ns), True)
    if made.bridge or BRIDGE in _links_named(BRIDGE):
        step("deleting the bridge", _link_del, BRIDGE)
    step("removing the iptables rule", _remove_iptables_rule)
    if made.made_etc_netns:
        step(f"removing {ETC_NETNS}", _rmdir_if_empty, ETC_NETNS)
    if made.made_netns_mount or made.made_netns_dir:
        step(f"removing {NETNS_DIR}", _remove_netns_dir, made)
    for path in (NODE_ROOT, STATE_ROOT, DATA_ROOT):
        step(f"removing {path}", _remove_path, path)
    if made.made_containerd_run:
        step(f"removing {CONTAINERD_RUN}", _rmdir_if_empty, CONTAINERD_RUN)
    if made.made_etc_docker:
        step(f"removing {ETC_DOCKER}", _rmdir_if_empty, ETC_DOCKER)


def _remove_services() -> None:
    services = _manager("service", "ls", "-q").stdout.split()
    if services:
        _manager("service", "rm", *services)
    # The manager's own task containers: killed rather than stopped (no grace period).
    tasks = _manager("ps", "-aq", "--filter", f"label={TASK_LABEL}").stdout.split()
    if tasks:
        _manager("rm", "-f", *tasks, timeout=120)
    out = _manager("network", "ls", "--filter", "scope=swarm", "--format", "{{.Name}}")
    networks = [n for n in out.stdout.split() if n != "ingress"]
    if networks:
        _manager("network", "rm", *networks)


def _leave_swarm() -> None:
    _manager("swarm", "leave", "--force", check=True)


def _stop_engines(engines: list[_Engine], grace: float) -> None:
    """SIGTERM each live namespace init (docker-init passes it to dockerd), SIGKILL the ones
    still there after `grace` s: that kills every process of the node."""
    live = [e for e in engines if e.proc.poll() is None]
    for engine in live:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(engine.init_fd, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for engine in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            engine.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for engine in engines:
        if engine.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(engine.init_fd, signal.SIGKILL)
            engine.proc.wait(timeout=30)
        os.close(engine.init_fd)


def _kill_strays() -> None:
    """SIGKILL anything of a worker node still running (a run that died left it)."""
    for _ in range(50):
        strays = _our_processes()
        if not strays:
            return
        for pid, _cmd in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise SwarmError(f"processes survive SIGKILL: {_our_processes()}")


def _remove_gwbridge() -> None:
    def gone() -> bool:
        if not _manager_has_network(GWBRIDGE):
            return True
        return _manager("network", "rm", GWBRIDGE).returncode == 0

    wait_until(gone, 15, f"removing {GWBRIDGE}", 0.5)


def _remove_cgroups() -> None:
    def removed() -> bool:
        for d in _cgroup_dirs():
            with contextlib.suppress(FileNotFoundError, OSError):
                d.rmdir()
        return not _cgroup_dirs()

    wait_until(removed, 10, "removing the worker cgroups", 0.1)


def _links_named(prefix: str) -> set[str]:
    links = json.loads(run("ip", "-j", "link", "show").stdout or "[]")
    return {li["ifname"] for li in links if li.get("ifname", "").startswith(prefix)}


def _link_del(name: str) -> None:
    if name in _links_named(name):
        run("ip", "link", "del", name)


def _netns_del(name: str) -> None:
    if name in run("ip", "netns", "list", check=False).stdout.split():
        run("ip", "netns", "del", name)


def _remove_iptables_rule() -> None:
    while run("iptables", "-C", "DOCKER-USER", *_IPTABLES_RULE, check=False).returncode == 0:
        run("iptables", "-D", "DOCKER-USER", *_IPTABLES_RULE)


def _rmdir_if_empty(path: str) -> None:
    if os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)


def _remove_netns_dir(made: _Made) -> None:
    """Undo what `ip netns add` did to /run/netns, once no namespace is left in it."""
    if not os.path.isdir(NETNS_DIR) or os.listdir(NETNS_DIR):
        return
    if made.made_netns_mount:
        # Busy for a moment after the last namespace file went (the dead nodes' mount
        # namespaces are released asynchronously).
        def unmounted() -> bool:
            if _is_mount(NETNS_DIR):
                run("umount", NETNS_DIR, check=False)
            return not _is_mount(NETNS_DIR)

        wait_until(unmounted, 10, f"unmounting {NETNS_DIR}", 0.2)
    if made.made_netns_dir:
        os.rmdir(NETNS_DIR)


def _remove_path(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _take_lock(wait: float) -> socket.socket:
    """The machine's swarm-fixture lock, waiting up to `wait` s for its holder to let go."""
    deadline = time.monotonic() + wait
    logged = False
    while True:
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(LOCK_ADDRESS)
            return lock
        except OSError:
            lock.close()
        if time.monotonic() >= deadline:
            raise SwarmError("another swarm fixture is running on this machine")
        if not logged:
            log.info("waiting up to %.0f s for another swarm fixture to stop", wait)
            logged = True
        time.sleep(0.5)


def cleanup() -> list[str]:
    """Remove what a dead swarm fixture left (refused while one runs); return leftovers()."""
    lock = _take_lock(0)
    try:
        _teardown(_Made.load() or _Made(), [])
        return leftovers()
    finally:
        lock.close()


@contextlib.contextmanager
def running_swarm(workers: int = 2, images: Sequence[str] = (), **kwargs: Any) -> Iterator[Swarm]:
    """`with running_swarm(2) as swarm:` (or `yield from` it in a pytest fixture)."""
    swarm = Swarm.start(workers, images, **kwargs)
    try:
        yield swarm
    finally:
        swarm.stop()


REQUIRE_CLUSTER = os.environ.get("KG_REQUIRE_CLUSTER") == "1"


def cluster_unavailable_reason() -> str | None:
    """Why a swarm cannot be brought up here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "the swarm fixture needs Linux (network namespaces)"
    if os.geteuid() != 0:
        return "the swarm fixture needs root (network namespaces, mounts, iptables)"
    tools = ("ip", "iptables", "iptables-save", "unshare", "nsenter", "dockerd", "docker", "awk")
    missing = [t for t in tools if not shutil.which(t)]
    if _init_binary() is None:
        missing.append("docker-init (or tini)")
    if missing:
        return f"missing tools: {', '.join(missing)}"
    try:
        out = _manager("info", "--format", "{{json .Swarm}}", timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no Docker engine answers ({exc})"
    if out.returncode != 0:
        return f"no Docker engine answers at {MANAGER_SOCKET} ({out.stderr.strip()})"
    swarm = json.loads(out.stdout)
    stale = _Made.load()
    if swarm.get("LocalNodeState", "inactive") != "inactive" and (
        stale is None or swarm.get("NodeAddr") != stale.host_address
    ):
        return "the Docker engine is already in swarm mode (the fixture's manager must not be)"
    return None


def require_cluster() -> None:
    """In a pytest test or fixture: skip when a swarm cannot be brought up here, or fail
    when KG_REQUIRE_CLUSTER=1 (as tests/conftest.py's require_docker does)."""
    import pytest

    reason = cluster_unavailable_reason()
    if reason is None:
        return
    if REQUIRE_CLUSTER:
        pytest.fail(f"KG_REQUIRE_CLUSTER=1 but the swarm fixture cannot run: {reason}")
    pytest.skip(reason)


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    command = argv[0] if argv else "leftovers"
    if command == "leftovers":
        found = leftovers()
    elif command == "cleanup":
        found = cleanup()
    else:
        print("usage: python -m tests.support.swarm [leftovers|cleanup]", file=sys.stderr)
        return 2
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

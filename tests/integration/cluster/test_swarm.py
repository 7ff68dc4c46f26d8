"""The swarm fixture itself (tests/support/swarm.py): a 3-node swarm on this machine, a
global dnsrr service on an overlay answering in host mode on every node, a killed worker
marked Down, and teardowns that leave nothing (after a stop, a failed start, a dead run).

The probe service runs a small image (debian:trixie-slim, the kernel image's base, when
present): perl and getent are all it needs, so copying it to the workers takes seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel_gateway.settings import DEFAULT_IMAGE
from tests.support import swarm as swarm_module
from tests.support.ports import free_port
from tests.support.swarm import (
    NODE_ROOT,
    REQUIRE_CLUSTER,
    Node,
    Swarm,
    leftovers,
    require_cluster,
    run,
)

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]
SERVICE = "kgsw-probe"
NETWORK = "kgsw-probe-net"
# Small images with perl and getent, smallest first; the kernel image works too (slowly).
PROBE_IMAGES = [
    os.environ.get("KG_CLUSTER_TEST_IMAGE", ""),
    "debian:trixie-slim",
    "debian:bookworm-slim",
    DEFAULT_IMAGE,
]

# A forking HTTP server on :8888. GET / -> "node=<swarm node id>"; /peers -> GET / of every
# address tasks.$SVC resolves to, over the overlay; /engine -> the NodeID that the engine
# behind /engine.sock (the node's {NODE_ROOT}/docker.sock) reports.
PROBE = r"""
use strict; use IO::Socket::INET; use IO::Socket::UNIX; $SIG{CHLD} = 'IGNORE';
my $srv = IO::Socket::INET->new(LocalPort => 8888, Listen => 64, ReuseAddr => 1) or die "$!";
sub get { my ($s, $path) = @_; return "ERROR $!\n" unless $s;
  print $s "GET $path HTTP/1.0\r\nHost: x\r\n\r\n"; local $/; my $r = <$s> // '';
  $r =~ s/^.*?\r\n\r\n//s; return $r }
while (1) {
  my $c = $srv->accept or next;
  if (fork) { close $c; next }
  my $req = <$c>; my $path = (split ' ', $req // '')[1] // '/';
  while (my $l = <$c>) { last if $l =~ /^\r?\n$/ }
  my $body = "node=$ENV{NODE}\n";
  if ($path eq '/peers') {
    my %seen; my @ips = grep { !$seen{$_}++ }
      map { (split ' ')[0] } `getent ahostsv4 tasks.$ENV{SVC}`;
    for my $ip (@ips) {
      my $s = IO::Socket::INET->new(PeerAddr => $ip, PeerPort => 8888, Timeout => 5);
      $body .= "peer $ip " . get($s, '/');
    }
  } elsif ($path eq '/engine') {
    my $info = get(IO::Socket::UNIX->new(Peer => '/engine.sock'), '/info');
    my ($id) = $info =~ /"NodeID":"([^"]*)"/; $body .= "engine=" . ($id // 'none') . "\n";
  }
  print $c "HTTP/1.0 200 OK\r\nContent-Length: " . length($body) . "\r\n\r\n$body";
  exit 0;
}
"""


def probe_image() -> str:
    for image in PROBE_IMAGES:
        if image and run("docker", "image", "inspect", image, check=False).returncode == 0:
            return image
    reason = f"none of the probe images is present: {[i for i in PROBE_IMAGES if i]}"
    if REQUIRE_CLUSTER:
        pytest.fail(f"KG_REQUIRE_CLUSTER=1 but {reason}")
    pytest.skip(reason)


def get(node: Node, port: int, path: str) -> dict[str, list[str]]:
    """GET the probe on the node's address; its lines as {key: [values]}."""
    text = httpx.get(f"http://{node.address}:{port}{path}", timeout=20).text
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=") if not line.startswith("peer ") else ("peer", "", line)
        found.setdefault(key, []).append(value)
    return found


def wait_answers(node: Node, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(node, port, "/")
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def image() -> str:
    require_cluster()
    return probe_image()


@pytest.fixture(scope="class")
def swarm(image: str) -> Iterator[Swarm]:
    s = Swarm.start(workers=2, images=[image])
    try:
        yield s
    finally:
        s.stop()
    assert s.leftovers() == []


@pytest.fixture(scope="class")
def probe_port(swarm: Swarm, image: str) -> int:
    port = free_port()
    manager = swarm.manager
    swarm.cli(manager, "network", "create", "-d", "overlay", "--attachable", NETWORK)
    swarm.cli(
        manager, "service", "create", "-d", "--name", SERVICE,
        "--mode", "global", "--endpoint-mode", "dnsrr", "--network", NETWORK,
        "--publish", f"mode=host,target=8888,published={port}",
        "--mount", f"type=bind,src={NODE_ROOT}/docker.sock,dst=/engine.sock",
        "--user", "0", "--stop-grace-period", "1s",
        "-e", f"SVC={SERVICE}", "-e", "NODE={{.Node.ID}}",
        image, "perl", "-e", PROBE,
    )  # fmt: skip
    swarm.wait_tasks(SERVICE, 3, timeout=90)
    for node in swarm.nodes:
        wait_answers(node, port)
    return port


class TestASwarm:
    """One 3-node swarm for these tests, torn down (and checked clean) after the last."""

    def test_three_nodes_and_a_global_service_on_every_one(
        self, swarm: Swarm, probe_port: int
    ) -> None:
        ls = swarm.cli(swarm.manager, "node", "ls", "--format", "{{.ID}} {{.Hostname}} {{.Status}}")
        rows = [line.split() for line in ls.stdout.splitlines()]
        assert sorted(r[0] for r in rows) == sorted(n.node_id for n in swarm.nodes)
        assert all(r[2] == "Ready" for r in rows), rows
        assert {"w1", "w2"} <= {r[1] for r in rows}
        ids = {n.node_id for n in swarm.nodes}
        for node in swarm.nodes:
            # Host mode: the node's own address reaches the task on that node.
            assert get(node, probe_port, "/")["node"] == [node.node_id]
            # tasks.<svc> resolves, inside a task, to the 3 tasks; each answers over the overlay
            # (worker to worker included).
            # Swarm's DNS learns of tasks over a few seconds: wait for the third.
            deadline = time.monotonic() + 30
            peers = get(node, probe_port, "/peers")["peer"]
            while len(peers) < 3 and time.monotonic() < deadline:
                time.sleep(1)
                peers = get(node, probe_port, "/peers")["peer"]
            assert len(peers) == 3, peers
            assert {p.split("node=")[-1] for p in peers} == ids, peers
            # Trap 1: {NODE_ROOT}/docker.sock is the node's own engine on every node.
            assert get(node, probe_port, "/engine")["engine"] == [node.node_id]

    def test_node_folders_are_private_and_seen_from_the_host(self, swarm: Swarm) -> None:
        swarm.makedirs("kgsw-test")
        for node in swarm.nodes:
            swarm.node_shell(node, f"echo {node.name} > {NODE_ROOT}/kgsw-test/who")
        for node in swarm.nodes:
            assert Path(node.root, "kgsw-test", "who").read_text() == f"{node.name}\n"
            host = swarm.node_shell(node, "hostname").stdout.strip()
            assert node.is_manager or host == node.name
        for node in swarm.workers:
            # The node's /var/run/docker.sock is its own engine too; no default route.
            info = swarm.node_shell(node, "docker info --format '{{.Swarm.NodeID}}'").stdout
            assert info.strip() == node.node_id
            assert "default" not in swarm.node_shell(node, "ip route").stdout

    def test_a_killed_worker_is_marked_down(self, swarm: Swarm, probe_port: int) -> None:
        victim = swarm.workers[-1]
        survivors = [n for n in swarm.nodes if n is not victim]
        assert victim.pid is not None and victim.init_pid is not None
        started = time.monotonic()
        swarm.kill_node(victim)
        # Every process of the node went at once: its engine, containerd, shims, the task.
        for pid in (victim.pid, victim.init_pid):
            assert not Path(f"/proc/{pid}").exists()
        assert not [p for p in swarm_module._our_processes() if f"/{victim.name}/" in p[1]]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{victim.address}:{probe_port}/", timeout=5)
        took = swarm.wait_node_state(victim, "down", timeout=60)
        elapsed = time.monotonic() - started
        print(f"worker killed -> marked Down after {elapsed:.1f} s")
        assert took < 30
        for node in survivors:
            assert get(node, probe_port, "/")["node"] == [node.node_id]
        assert swarm.node_shell(victim, "true", check=False).returncode != 0


def test_teardown_leaves_nothing() -> None:
    require_cluster()
    netns_dir, etc_netns = os.path.exists("/run/netns"), os.path.exists("/etc/netns")
    swarm = Swarm.start(workers=1)
    assert [n.name for n in swarm.nodes] == ["manager", "w1"]
    assert swarm.leftovers() != []  # it sees what is up
    swarm.stop()
    swarm.stop()  # idempotent
    assert swarm.leftovers() == []
    assert swarm_module._manager_swarm().get("LocalNodeState") == "inactive"
    assert (os.path.exists("/run/netns"), os.path.exists("/etc/netns")) == (netns_dir, etc_netns)


def test_a_failed_start_tears_down(monkeypatch: pytest.MonkeyPatch) -> None:
    require_cluster()
    netns_dir = os.path.exists("/run/netns")

    def boom(self: Swarm) -> bool:
        raise RuntimeError("boom")

    monkeypatch.setattr(Swarm, "_all_ready", boom)
    with pytest.raises(RuntimeError, match="boom"):
        Swarm.start(workers=1)
    assert leftovers() == []
    assert os.path.exists("/run/netns") == netns_dir


def test_what_a_killed_run_left_is_cleaned_up() -> None:
    require_cluster()
    code = "from tests.support.swarm import Swarm; Swarm.start(1); print('up', flush=True); input()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert leftovers() != []
    assert swarm_module.cleanup() == []

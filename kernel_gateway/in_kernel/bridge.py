"""Run any Jupyter kernelspec in a kernel container, reachable on the gateway's ipc sockets.

Usage (the container's command, as the gateway writes it):

    python bridge.py /conn/kernel.json /opt/kernel/kernelspecs/<language>/kernel.json

The gateway talks to every kernel over ZMQ ipc sockets in the bind-mounted `/conn`
(`k-1` ... `k-5`), because the container has no network. Not every kernel can bind
those: Deno's kernel listens with `Deno.listen` (TCP only), and IRkernel and JJava name
ipc sockets their own way. So unless the kernelspec says the kernel speaks ipc itself
(`metadata.kernel_gateway.transport == "ipc"`, as ipykernel-based kernels do), this
process binds the ipc sockets, starts the kernel on loopback TCP ports inside the
container (which has a loopback and nothing else), and forwards each channel:

    iopub:                      XPUB (ipc, bound) <-> XSUB (tcp), by `zmq.proxy` (libzmq's
                                own loop, in C); through `Router` for `late_results` kernels
    shell, control, stdin, hb:  ROUTER (ipc, bound) <-> one DEALER (tcp) per client socket
                                on the gateway's side (see `Router`)

Messages are passed as frames; only their headers are read, where said.

Signals. The gateway interrupts a cell with SIGINT to the container, which reaches
this process (Docker's init forwards it). The handler only wakes the `Relay` thread,
which passes the interrupt on while a cell runs (see `Watcher`): SIGINT to a kernel
whose kernelspec has `"interrupt_mode": "signal"`, a signed `interrupt_request` on its
control channel for `"message"` (Deno's and JJava's: a SIGINT would end them). SIGTERM
and SIGHUP are passed on; when the kernel ends, this process ends with the same status,
so the gateway sees the kernel's death as the container's. If forwarding breaks (a
thread dies), the kernel is killed, for the same reason: never a live kernel that
cannot be reached.

This file is copied into the container, with `jupyter_wire.py` beside it (the signing and
framing the gateway uses too), and imports nothing of the gateway.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # in the gateway's package
    from . import jupyter_wire
else:  # in a container's folder, beside this file
    import jupyter_wire

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
PORTS = (20000, 32000)
"""Where the kernel's loopback ports are chosen: below Linux's ephemeral range (32768 and
up), so no outgoing connection's own port can be one of them."""
MAX_CLIENTS = 64
"""Connections to the kernel kept per channel, one per gateway-side socket (LRU beyond)."""
HOLD_SECONDS = 1.0
"""The longest an `idle` is held back waiting for a late result."""


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a JSON object")
    return data


def free_ports(count: int) -> list[int]:
    """Loopback ports nothing listens on (the container's own network namespace)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(*PORTS)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def ipc_url(info: dict[str, Any], channel: str) -> str:
    return f"ipc://{info['ip']}-{info[channel + '_port']}"


def tcp_url(info: dict[str, Any], channel: str) -> str:
    return f"tcp://127.0.0.1:{info[channel + '_port']}"


def tcp_connection(ipc: dict[str, Any], path: str) -> dict[str, Any]:
    """The kernel's own connection file: the same key, on loopback TCP ports."""
    info = dict(ipc, transport="tcp", ip="127.0.0.1")
    for channel, port in zip(CHANNELS, free_ports(len(CHANNELS)), strict=True):
        info[channel + "_port"] = port
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    return info


def command_of(spec: dict[str, Any], spec_file: str, connection_file: str) -> list[str]:
    """The kernelspec's argv, with Jupyter's `{connection_file}` and `{resource_dir}`."""
    resource_dir = os.path.dirname(os.path.abspath(spec_file))
    return [
        str(arg)
        .replace("{connection_file}", connection_file)
        .replace("{resource_dir}", resource_dir)
        for arg in spec["argv"]
    ]


def env_of(spec: dict[str, Any], environ: dict[str, str]) -> dict[str, str]:
    """The environment with the kernelspec's `env`, `${VAR}` expanded as Jupyter does."""
    env = dict(environ)
    for key, value in (spec.get("env") or {}).items():
        env[str(key)] = string.Template(str(value)).safe_substitute(environ)
    return env


def peek(frames: list[bytes]) -> tuple[str, str, str, str]:
    """(msg_type, parent msg_id, parent msg_type, execution_state) of a message's frames.

    Only the header is parsed for every message; the parent header and the content only
    for `status` messages (small), never a display's megabytes.
    """
    try:
        i = frames.index(jupyter_wire.DELIM)
        header = json.loads(frames[i + 2])
        kind = str(header.get("msg_type", ""))
        if kind not in ("status", "execute_result"):
            return kind, "", "", ""
        parent = json.loads(frames[i + 3])
        state = ""
        if kind == "status":
            state = str(json.loads(frames[i + 5]).get("execution_state", ""))
        return kind, str(parent.get("msg_id", "")), str(parent.get("msg_type", "")), state
    except (ValueError, IndexError, AttributeError, TypeError):
        return "", "", "", ""


def _bytes(frames: list[Any]) -> list[bytes]:
    return [f.bytes if hasattr(f, "bytes") else f for f in frames]


class Watcher:
    """Which cell the kernel runs now, from the `status` messages it publishes on IOPub.

    An interrupt is passed on only while a cell runs. Python's kernel ignores SIGINT
    between cells, and the gateway relies on that (it repeats an interrupt until the
    cell is idle, so the last one can land just after); Deno's kernel would instead
    terminate whatever it runs next, so interrupts that arrive between cells stop here.
    It sees the kernel's own order: fed by `LateResults` where IOPub passes through
    `Router`, else subscribed to the gateway's IOPub socket.
    """

    def __init__(self) -> None:
        self.running: str | None = None
        """The msg_id of the execute_request being run, or None between cells."""

    def see(self, frames: list[bytes]) -> None:
        kind, parent, parent_type, state = peek(frames)
        if kind != "status" or parent_type != "execute_request":
            return
        if state == "busy":
            self.running = parent
        elif state == "idle" and self.running == parent:
            self.running = None

    def subscribe(self, url: str, on_failure: Callable[[], None]) -> None:
        """Follow IOPub on a SUB socket of its own, on a thread of its own."""

        def run() -> None:
            import zmq

            sock: Any = zmq.Context.instance().socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            _reconnect_quickly(sock)
            sock.connect(url)
            while True:
                self.see(sock.recv_multipart())

        _thread("bridge-watcher", run, on_failure)


class Requester:
    """Signed requests of the bridge's own (interrupts, probes) on one of the kernel's
    channels, with the connection's key. Used from one thread only (ZMQ sockets are not
    thread-safe): the one that also reads and drops its replies."""

    def __init__(self, info: dict[str, Any], url: str, context: Any) -> None:
        import zmq

        self._signer = jupyter_wire.Signer.of(info)
        self._session = uuid.uuid4().hex
        self.socket: Any = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        _reconnect_quickly(self.socket)
        self.socket.connect(url)
        self.sent: set[str] = set()
        """msg_ids sent and not yet seen idle (kept small by their owner)."""

    def send(self, msg_type: str) -> str:
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "session": self._session,
            "username": "kernel-gateway",
            "date": datetime.now(timezone.utc).isoformat(),  # noqa: UP017 - any Python 3
            "msg_type": msg_type,
            "version": "5.3",
        }
        parts = [json.dumps(p).encode() for p in (header, {}, {}, {})]
        self.socket.send_multipart(jupyter_wire.serialize(parts, self._signer))
        if len(self.sent) > 1000:
            self.sent.clear()
        self.sent.add(msg_id)
        return msg_id


class Relay:
    """Passes the container's SIGINTs on to the kernel, from a thread of its own.

    The signal handler only writes a byte to a pipe (nothing in a handler may take a
    lock or touch a ZMQ socket); this thread wakes on it and, while `watcher` says a
    cell runs, sends SIGINT or an `interrupt_request` (its socket is this thread's
    alone, and so is the reading of the replies).
    """

    def __init__(
        self,
        watcher: Watcher,
        child: subprocess.Popen[bytes],
        interrupter: Requester | None,
    ) -> None:
        self.watcher = watcher
        self.child = child
        self.interrupter = interrupter
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)

    def on_signal(self, signum: int, frame: Any) -> None:
        try:
            os.write(self.write_fd, b"i")
        except BlockingIOError:
            pass  # a wake-up is already pending

    def run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.read_fd, zmq.POLLIN)
        if self.interrupter is not None:
            poller.register(self.interrupter.socket, zmq.POLLIN)
        while True:
            for item, _ in poller.poll():
                if item == self.read_fd:
                    os.read(self.read_fd, 64)
                    self._interrupt()
                elif self.interrupter is not None:
                    self.interrupter.socket.recv_multipart()  # a reply: dropped

    def _interrupt(self) -> None:
        if self.watcher.running is None:
            return  # between cells: see Watcher
        if self.interrupter is not None:
            self.interrupter.send("interrupt_request")
        else:
            _kill(self.child, signal.SIGINT)


def start_proxies(
    ipc: dict[str, Any],
    tcp: dict[str, Any],
    watcher: Watcher,
    on_failure: Callable[[], None],
    *,
    late_results: bool = False,
) -> Any:
    """Bind the gateway's ipc sockets and forward each to the kernel's TCP port.

    `late_results`: IOPub goes through `Router` too, which keeps each cell's results
    ahead of its `idle` (see `LateResults`) and tells `watcher` the kernel's own order;
    else libzmq's own proxy forwards it and `watcher` subscribes to the forwarded stream.
    """
    import zmq

    context = zmq.Context()
    if late_results:
        front, back = context.socket(zmq.PUB), context.socket(zmq.SUB)
        back.setsockopt(zmq.SUBSCRIBE, b"")
    else:
        front, back = context.socket(zmq.XPUB), context.socket(zmq.XSUB)
    for sock in (front, back):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    front.bind(ipc_url(ipc, "iopub"))
    _reconnect_quickly(back)
    back.connect(tcp_url(tcp, "iopub"))
    if not late_results:
        _thread("bridge-iopub", lambda: zmq.proxy(front, back), on_failure)
        watcher.subscribe(ipc_url(ipc, "iopub"), on_failure)
    fronts = {}
    for channel in ("shell", "control", "stdin", "hb"):
        router_front = context.socket(zmq.ROUTER)
        router_front.setsockopt(zmq.LINGER, 0)
        router_front.bind(ipc_url(ipc, channel))
        fronts[channel] = router_front
    late = None
    if late_results:
        prober = Requester(tcp, tcp_url(tcp, "shell"), context)
        late = LateResults(front, back, prober, watcher)
    router = Router(context, fronts, {c: tcp_url(tcp, c) for c in fronts}, late)
    _thread("bridge-router", router.run, on_failure)
    return context


def _reconnect_quickly(sock: Any) -> None:
    import zmq

    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 100)


def _thread(name: str, target: Callable[[], object], on_failure: Callable[[], None]) -> None:
    """Run `target` on a daemon thread; if it ever returns or raises, `on_failure`."""

    def run() -> None:
        try:
            target()
        except BaseException:
            traceback.print_exc()
        print(f"bridge: {name} stopped; ending the kernel", file=sys.stderr, flush=True)
        on_failure()

    threading.Thread(target=run, name=name, daemon=True).start()


class LateResults:
    """Keeps a cell's result ahead of its `idle` status, for kernels that publish it late.

    Deno's kernel (2.9) publishes a cell's `execute_result` on an asynchronous path of
    its own: now and then it goes out about a millisecond after the cell's `idle`
    (seen in 2 of 100 cells on an idle machine, more under load), and a client that
    ends the cell at `idle` (as the gateway and Jupyter's clients do) loses it. So an
    execute_request's `idle` that comes before any result is held back, and the bridge
    sends the kernel a `kernel_info_request` of its own on shell: once that probe's
    own `idle` comes back, the kernel has published what it had queued before it, the
    late result included, and the held `idle` follows. A result that arrives first
    releases the `idle` at once; none is held past `HOLD_SECONDS`. The probe's
    messages are never passed on. Every message is shown to `watcher` first, in the
    kernel's own order.
    """

    def __init__(
        self, front: Any, back: Any, prober: Requester, watcher: Watcher | None = None
    ) -> None:
        self.front = front
        self.back = back
        self.prober = prober
        self.watcher = watcher
        self._results: set[str] = set()
        """Cells whose result went out before their idle."""
        self._held: dict[str, tuple[list[Any], float]] = {}
        self._probes: dict[str, str] = {}
        """probe msg_id -> the cell whose idle it releases"""

    def on_message(self, frames: list[Any]) -> None:
        raw = _bytes(frames)
        if self.watcher is not None:
            self.watcher.see(raw)
        kind, parent, parent_type, state = peek(raw)
        cell = self._probes.get(parent)
        if cell is not None or parent in self.prober.sent:
            if kind == "status" and state == "idle":
                self._probes.pop(parent, None)
                self.prober.sent.discard(parent)
                if cell is not None:
                    self._release(cell)
            return  # the probe's own messages are never passed on
        if kind == "status" and state == "idle" and parent_type == "execute_request":
            if parent in self._results:
                self._results.discard(parent)
            else:
                self._held[parent] = (frames, time.monotonic())
                self._probes[self.prober.send("kernel_info_request")] = parent
                return
        self.front.send_multipart(frames, copy=False)
        if kind == "execute_result" and parent_type == "execute_request":
            if parent in self._held:
                self._release(parent)
            else:
                self._results.add(parent)
                if len(self._results) > 1000:  # cells whose idle never came
                    self._results.clear()

    def _release(self, cell: str) -> None:
        held = self._held.pop(cell, None)
        if held is not None:
            self.front.send_multipart(held[0], copy=False)

    @property
    def waiting(self) -> bool:
        return bool(self._held)

    def expire(self) -> None:
        now = time.monotonic()
        for cell, (_, since) in list(self._held.items()):
            if now - since >= HOLD_SECONDS:
                self._release(cell)
        if not self._held:
            self._probes.clear()


class Router:
    """Each gateway-side socket gets a connection of its own to the kernel.

    A plain ROUTER/DEALER proxy adds a routing identity that the kernel must echo;
    Deno's kernel does not route replies by it. So, as a ROUTER front, every client
    identity gets its own DEALER to the kernel, and the kernel sees as many ordinary
    clients as the gateway has sockets (its own, and one per Jupyter WebSocket): each
    reply goes back over the connection its request came on. A client's own identity
    (the gateway gives a Jupyter connection's shell and stdin sockets the same one) is
    kept on its DEALERs, so a kernel's `input_request` finds the client that asked. With
    `late`, IOPub is forwarded here too, through `LateResults`. All of it on one thread.
    """

    def __init__(
        self,
        context: Any,
        fronts: dict[str, Any],
        urls: dict[str, str],
        late: LateResults | None = None,
    ) -> None:
        self._context = context
        self._fronts = fronts
        self._urls = urls
        self._late = late
        self._backs: dict[str, OrderedDict[bytes, Any]] = {c: OrderedDict() for c in fronts}
        self._owner: dict[Any, tuple[str, bytes]] = {}

    def run(self) -> None:
        import zmq

        poller = zmq.Poller()
        channel_of = {}
        for channel, front in self._fronts.items():
            poller.register(front, zmq.POLLIN)
            channel_of[front] = channel
        late = self._late
        if late is not None:
            poller.register(late.back, zmq.POLLIN)
            poller.register(late.prober.socket, zmq.POLLIN)
        while True:
            timeout = 50 if late is not None and late.waiting else None
            for sock, _ in poller.poll(timeout):
                if sock.closed:
                    continue  # evicted earlier in this same batch
                if sock in channel_of:
                    frames = sock.recv_multipart(copy=False)
                    if len(frames) > 1:
                        back = self._back(poller, channel_of[sock], frames[0].bytes)
                        back.send_multipart(frames[1:], copy=False)
                elif late is not None and sock is late.back:
                    late.on_message(sock.recv_multipart(copy=False))
                else:
                    frames = sock.recv_multipart(copy=False)
                    owner = self._owner.get(sock)
                    if owner is not None:
                        channel, client = owner
                        self._fronts[channel].send_multipart([client, *frames], copy=False)
            if late is not None and late.waiting:
                late.expire()

    def _back(self, poller: Any, channel: str, client: bytes) -> Any:
        import zmq

        backs = self._backs[channel]
        back = backs.get(client)
        if back is not None:
            backs.move_to_end(client)
            return back
        if len(backs) >= MAX_CLIENTS:
            _, oldest = backs.popitem(last=False)
            poller.unregister(oldest)
            self._owner.pop(oldest, None)
            oldest.close(linger=0)
        back = self._context.socket(zmq.DEALER)
        back.setsockopt(zmq.LINGER, 0)
        if client and not client.startswith(b"\x00"):  # a client's own, not ZMQ's made-up one
            back.setsockopt(zmq.IDENTITY, client)
        _reconnect_quickly(back)
        back.connect(self._urls[channel])
        backs[client] = back
        self._owner[back] = (channel, client)
        poller.register(back, zmq.POLLIN)
        return back


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: bridge.py CONNECTION_FILE KERNELSPEC", file=sys.stderr)
        return 2
    import zmq

    connection_file, spec_file = argv
    ipc = load(connection_file)
    spec = load(spec_file)
    options = (spec.get("metadata") or {}).get("kernel_gateway") or {}
    direct = options.get("transport") == "ipc"
    child: subprocess.Popen[bytes] | None = None

    def fail() -> None:
        if child is not None:
            _kill(child, signal.SIGKILL)
        else:
            os._exit(70)

    watcher = Watcher()
    if direct:
        kernel_file, info = connection_file, ipc
        watcher.subscribe(ipc_url(ipc, "iopub"), fail)
    else:
        kernel_file = os.path.join(os.path.dirname(connection_file), "kernel-tcp.json")
        info = tcp_connection(ipc, kernel_file)
        late = bool(options.get("late_results"))
        start_proxies(ipc, info, watcher, fail, late_results=late)
    interrupter = None
    if spec.get("interrupt_mode") == "message":
        control = ipc_url(ipc, "control") if direct else tcp_url(info, "control")
        interrupter = Requester(info, control, zmq.Context.instance())
    child = subprocess.Popen(
        command_of(spec, spec_file, kernel_file), env=env_of(spec, dict(os.environ))
    )
    relay = Relay(watcher, child, interrupter)
    _thread("bridge-interrupts", relay.run, fail)

    def pass_on(signum: int, frame: Any) -> None:
        if child is not None:
            _kill(child, signum)

    signal.signal(signal.SIGINT, relay.on_signal)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, pass_on)
    status = child.wait()
    # Killed by a signal: end the same way the shell reports it, 128 + the signal.
    return 128 - status if status < 0 else status


def _kill(child: subprocess.Popen[bytes], signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

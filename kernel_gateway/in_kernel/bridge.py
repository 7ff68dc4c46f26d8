"""Run any Jupyter kernelspec in a kernel container, reachable on the gateway's ipc sockets.

Usage (the container's command, as the gateway writes it):

    python bridge.py /conn/kernel.json /opt/kernel/kernelspecs/<language>/kernel.json

The gateway talks to every kernel over ZMQ ipc sockets in the bind-mounted `/conn`
(`k-1` ... `k-5`), because the container has no network. Not every kernel can bind
those: Deno's kernel listens with `Deno.listen` (TCP only), and IRkernel names ipc
sockets its own way. So unless the kernelspec says the kernel speaks ipc itself
(`metadata.kernel_gateway.transport == "ipc"`, as ipykernel-based kernels do), this
process binds the ipc sockets, starts the kernel on loopback TCP ports inside the
container (which has a loopback and nothing else), and forwards each channel:

    iopub:                      XPUB   (ipc, bound)  <->  XSUB (tcp), by `zmq.proxy`
                                (libzmq's own loop, in C with the GIL released)
    shell, control, stdin, hb:  ROUTER (ipc, bound)  <->  one DEALER (tcp) per client
                                socket on the gateway's side (see `Router`)

Messages are passed as frames, never parsed.

Signals. The gateway interrupts a cell with SIGINT to the container, which reaches
this process (Docker's init forwards it). While a cell runs (see `Watcher`), a kernel
whose kernelspec has `"interrupt_mode": "signal"` gets the SIGINT; one with `"message"`
(Deno's and JJava's: a SIGINT would end them) gets a signed `interrupt_request` on its
control channel instead, sent from here with the connection's key. SIGTERM and SIGHUP
are passed on; when the kernel ends, this process ends with the same status, so the
gateway sees the kernel's death as the container's.

This file is copied into the container and imports nothing of the gateway.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a JSON object")
    return data


def free_ports(count: int) -> list[int]:
    """Loopback ports nothing listens on (the container's own network namespace)."""
    holders = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        holders.append(sock)
    ports = [s.getsockname()[1] for s in holders]
    for sock in holders:
        sock.close()
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


MAX_CLIENTS = 64
"""Connections to the kernel kept per channel, one per gateway-side socket (LRU beyond)."""


def start_proxies(ipc: dict[str, Any], tcp: dict[str, Any], *, late_results: bool = False) -> Any:
    """Bind the gateway's ipc sockets and forward each to the kernel's TCP port.

    `late_results`: IOPub goes through `Router` too, which keeps each cell's results
    ahead of its `idle` (see `LateResults`); else libzmq's own proxy forwards it.
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
        threading.Thread(
            target=_proxy, args=(front, back), name="bridge-iopub", daemon=True
        ).start()
    fronts = {}
    for channel in ("shell", "control", "stdin", "hb"):
        router_front = context.socket(zmq.ROUTER)
        router_front.setsockopt(zmq.LINGER, 0)
        router_front.bind(ipc_url(ipc, channel))
        fronts[channel] = router_front
    late = None
    if late_results:
        late = LateResults(front, back, Requester(tcp, tcp_url(tcp, "shell"), context))
    router = Router(context, fronts, {c: tcp_url(tcp, c) for c in fronts}, late)
    threading.Thread(target=router.run, name="bridge-router", daemon=True).start()
    return context


def _reconnect_quickly(sock: Any) -> None:
    import zmq

    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 100)


def _proxy(front: Any, back: Any) -> None:
    import zmq

    try:
        zmq.proxy(front, back)
    except zmq.ContextTerminated:
        pass


def peek(frames: list[bytes]) -> tuple[str, str, str, str]:
    """(msg_type, parent msg_id, parent msg_type, execution_state) of a message's frames."""
    try:
        i = frames.index(b"<IDS|MSG>")
        header, parent = json.loads(frames[i + 2]), json.loads(frames[i + 3])
        state = ""
        if header.get("msg_type") == "status":
            state = str(json.loads(frames[i + 5]).get("execution_state", ""))
        return (
            str(header.get("msg_type", "")),
            str(parent.get("msg_id", "")),
            str(parent.get("msg_type", "")),
            state,
        )
    except (ValueError, IndexError, AttributeError):
        return "", "", "", ""


HOLD_SECONDS = 1.0
"""The longest an `idle` is held back waiting for a late result."""


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
    messages are never passed on.
    """

    def __init__(self, front: Any, back: Any, prober: Requester) -> None:
        self.front = front
        self.back = back
        self.prober = prober
        self._results: set[str] = set()
        """Cells whose result went out before their idle."""
        self._held: dict[str, tuple[list[Any], float]] = {}
        self._probes: dict[str, str] = {}
        """probe msg_id -> the cell whose idle it releases"""

    def on_message(self, frames: list[Any]) -> None:
        raw = [f.bytes if hasattr(f, "bytes") else f for f in frames]
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


MAX_CLIENTS = 64
"""Connections to the kernel kept per channel, one per gateway-side socket (LRU beyond)."""


class Router:
    """Each gateway-side socket gets a connection of its own to the kernel.

    A plain ROUTER/DEALER proxy adds a routing identity that the kernel must echo;
    Deno's kernel does not route replies by it. So, as a ROUTER front, every client
    identity gets its own DEALER to the kernel, and the kernel sees as many ordinary
    clients as the gateway has sockets (its own, and one per Jupyter WebSocket): each
    reply goes back over the connection its request came on. With `late`, IOPub is
    forwarded here too, through `LateResults`.
    """

    def __init__(
        self,
        context: Any,
        fronts: dict[str, Any],
        urls: dict[str, str],
        late: LateResults | None = None,
    ) -> None:
        from collections import OrderedDict

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
        try:
            while True:
                timeout = 50 if late is not None and late.waiting else None
                for sock, _ in poller.poll(timeout):
                    if sock in channel_of:
                        frames = sock.recv_multipart(copy=False)
                        if len(frames) > 1:
                            back = self._back(poller, channel_of[sock], frames[0].bytes)
                            back.send_multipart(frames[1:], copy=False)
                        continue
                    if late is not None and sock is late.back:
                        late.on_message(sock.recv_multipart(copy=False))
                        continue
                    owner = self._owner.get(sock)
                    frames = sock.recv_multipart(copy=False)
                    if owner is not None:
                        channel, client = owner
                        self._fronts[channel].send_multipart([client, *frames], copy=False)
                if late is not None and late.waiting:
                    late.expire()
        except zmq.ContextTerminated:
            pass

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
        _reconnect_quickly(back)
        back.connect(self._urls[channel])
        backs[client] = back
        self._owner[back] = (channel, client)
        poller.register(back, zmq.POLLIN)
        return back


class Watcher:
    """Which cell the kernel runs now, from the `status` messages it publishes on IOPub.

    An interrupt is passed on only while a cell runs. Python's kernel ignores SIGINT
    between cells, and the gateway relies on that (it repeats an interrupt until the
    cell is idle, so the last one can land just after); Deno's kernel would instead
    terminate whatever it runs next, so interrupts that arrive between cells stop here.
    """

    def __init__(self, url: str) -> None:
        import zmq

        self.running: str | None = None
        """The msg_id of the execute_request being run, or None between cells."""
        self._socket: Any = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        _reconnect_quickly(self._socket)
        self._socket.connect(url)
        threading.Thread(target=self._run, name="bridge-watcher", daemon=True).start()

    def _run(self) -> None:
        import zmq

        try:
            while True:
                self.see(self._socket.recv_multipart())
        except zmq.ZMQError:
            pass

    def see(self, frames: list[bytes]) -> None:
        try:
            i = frames.index(b"<IDS|MSG>")
            header, parent, content = (json.loads(frames[i + n]) for n in (2, 3, 5))
        except (ValueError, IndexError):
            return
        if header.get("msg_type") != "status" or parent.get("msg_type") != "execute_request":
            return
        state = content.get("execution_state")
        if state == "busy":
            self.running = parent.get("msg_id")
        elif state == "idle" and self.running == parent.get("msg_id"):
            self.running = None


class Requester:
    """Signed requests of the bridge's own (interrupts, probes) on one of the kernel's
    channels, with the connection's key; replies are read and dropped."""

    def __init__(self, info: dict[str, Any], url: str, context: Any = None) -> None:
        import zmq

        self._key = str(info["key"]).encode()
        self._digest = getattr(hashlib, str(info.get("signature_scheme", "hmac-sha256"))[5:])
        self._session = uuid.uuid4().hex
        self.socket: Any = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        _reconnect_quickly(self.socket)
        self.socket.connect(url)
        self.sent: set[str] = set()
        """msg_ids sent and not yet seen idle (kept small by their owner)."""
        self._lock = threading.Lock()

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
        mac = hmac.new(self._key, digestmod=self._digest)
        for part in parts:
            mac.update(part)
        with self._lock:
            self.socket.send_multipart([b"<IDS|MSG>", mac.hexdigest().encode(), *parts])
        if len(self.sent) > 1000:
            self.sent.clear()
        self.sent.add(msg_id)
        return msg_id

    def drain_in_background(self) -> None:
        threading.Thread(target=self._drain, name="bridge-replies", daemon=True).start()

    def _drain(self) -> None:
        import zmq

        try:
            while True:
                self.socket.recv_multipart()
        except zmq.ZMQError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: bridge.py CONNECTION_FILE KERNELSPEC", file=sys.stderr)
        return 2
    connection_file, spec_file = argv
    ipc = load(connection_file)
    spec = load(spec_file)
    options = spec.get("metadata", {}).get("kernel_gateway", {})
    direct = options.get("transport") == "ipc"
    if direct:
        kernel_file, info = connection_file, ipc
    else:
        kernel_file = os.path.join(os.path.dirname(connection_file), "kernel-tcp.json")
        info = tcp_connection(ipc, kernel_file)
        start_proxies(ipc, info, late_results=bool(options.get("late_results")))
    # The gateway's own IOPub socket: the kernel's when it binds ipc itself, else this
    # process's XPUB (Deno's kernel serves a second subscriber of its own badly).
    watcher = Watcher(ipc_url(ipc, "iopub"))
    interrupter = None
    if spec.get("interrupt_mode") == "message":
        control = ipc_url(ipc, "control") if direct else tcp_url(info, "control")
        interrupter = Requester(info, control)
        interrupter.drain_in_background()
    command = [str(arg).replace("{connection_file}", kernel_file) for arg in spec["argv"]]
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    child = subprocess.Popen(command, env=env)

    def on_interrupt(signum: int, frame: Any) -> None:
        if watcher.running is None:
            return  # between cells: see Watcher
        if interrupter is not None:
            interrupter.send("interrupt_request")
        else:
            _kill(child, signal.SIGINT)

    def pass_on(signum: int, frame: Any) -> None:
        _kill(child, signum)

    signal.signal(signal.SIGINT, on_interrupt)
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

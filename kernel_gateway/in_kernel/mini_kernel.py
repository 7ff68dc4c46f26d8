"""The child: what a fork of the fork server (`fork_server.py`) runs to serve one request,
as a small Jupyter kernel with a key of its own.

A child serves one request and ends, so what a long-lived kernel sets up once (a ZMQ
context and its I/O thread, three sockets, ipykernel's IOPub thread with its event loop,
output streams with a watcher thread each) would be most of a request's cost. Instead:
- one Unix stream to the gateway, which listens on `<prefix>.sock` before the fork, so
  the child connects once and nothing waits for a subscription; on it, the same signed
  Jupyter messages, each framed as a record naming its channel (`jupyter_wire.py`, the
  gateway's own copy);
- `sys.stdout`/`sys.stderr` collect text, and file descriptors 1 and 2 are pipes (C
  libraries' and subprocesses' output) read by one thread, which sends what piled up as
  one `stream` message per stream every 50 ms; the end of a cell sends the rest before
  its reply (`_Output`).

This module is imported by the fork server, before its first fork, and so are the modules
it imports: a module imported lazily here would be imported again by every child (a child
imports nothing: tests/integration/test_stateless.py, tests/unit/test_in_kernel_programs.py).
"""

from __future__ import annotations

import codecs
import datetime
import io
import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import traceback
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # in the gateway's package
    from . import jupyter_wire
else:  # in a container's folder, beside this file
    import jupyter_wire

READ_BYTES = 65536
MESSAGE_CHARS = 1 << 20
TICK_SECONDS = 0.05
FLUSH_CHARS = 64 * 1024


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


class Wire:
    """The child's end of the stream: records in (the main thread), records out.

    Records are written by a thread of their own, whole and in the order they were
    queued, whichever thread queued them: a signal handler that raises (SIGINT's
    KeyboardInterrupt while a cell runs, a library's alarm) runs only in the main thread,
    so it may stop a record from being queued but never leaves half of one on the
    stream, where the gateway would end the kernel for it. A process the cell forks
    (multiprocessing, `os.fork()`) inherits the socket but sends nothing on it, as
    jupyter_client's Session refuses to: its output goes to fds 1 and 2 (`_Output`)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid = os.getpid()
        self.queue: queue.SimpleQueue[bytes | threading.Event] = queue.SimpleQueue()
        threading.Thread(target=self._write, name="wire", daemon=True).start()

    def send(self, channel: str, frames: list[bytes]) -> None:
        if os.getpid() == self.pid:
            record = jupyter_wire.stream_record(channel, frames)
            self.queue.put(record)  # one C call: whole or not at all

    def drain(self) -> None:
        """Return once everything queued so far is written."""
        written = threading.Event()
        self.queue.put(written)
        written.wait()

    def _write(self) -> None:
        while True:
            item = self.queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self.sock.sendall(item)
            except OSError:  # the gateway closed the stream: the request is over
                os._exit(0)

    def receive(self) -> tuple[str, list[bytes]]:
        head = jupyter_wire.RECORD_HEAD
        length, tag, count = head.unpack(_recv_exactly(self.sock, head.size))
        body = _recv_exactly(self.sock, length)
        channel = jupyter_wire.CHANNEL_OF_TAG.get(tag, "shell")
        return channel, jupyter_wire.record_frames(body, count)


def stream_session() -> Any:
    """What IPython's display hook and publisher use of jupyter_client's Session (`msg`,
    `send`; they accept only a Session), and what the child needs to read a request, with
    nothing per request going through traitlets: signed with the request's key
    (`jupyter_wire.Signer`, as the gateway checks) and sent on the child's
    stream, where the "socket" IPython hands `send` names the channel. Built in the fork
    server; `start` gives it a request's key, id and stream in the child."""
    from jupyter_client.session import Session, extract_header, json_packer

    class StreamSession(Session):
        wire: Wire | None = None
        signer: jupyter_wire.Signer
        sid = ""

        def start(self, key: bytes, wire: Wire) -> None:
            self.signer = jupyter_wire.Signer(key)
            self.sid = uuid.uuid4().hex
            self.wire = wire

        def msg_header(self, msg_type: str) -> dict[str, Any]:
            return {
                "msg_id": uuid.uuid4().hex,
                "msg_type": msg_type,
                "username": self.username,
                "session": self.sid,
                "date": datetime.datetime.now(datetime.UTC).isoformat(),
                "version": "5.3",
            }

        def msg(
            self,
            msg_type: str,
            content: Any = None,
            parent: Any = None,
            header: Any = None,
            metadata: Any = None,
        ) -> dict[str, Any]:
            header = self.msg_header(msg_type) if header is None else header
            return {
                "header": header,
                "msg_id": header["msg_id"],
                "msg_type": header["msg_type"],
                "parent_header": {} if parent is None else extract_header(parent),
                "content": {} if content is None else content,
                "metadata": dict(metadata or {}),
            }

        def sign(self, parts: list[bytes]) -> bytes:
            return self.signer.sign(parts)

        def send(
            self,
            stream: Any,
            msg_or_type: Any,
            content: Any = None,
            parent: Any = None,
            ident: Any = None,
            buffers: Any = None,
            track: bool = False,
            header: Any = None,
            metadata: Any = None,
        ) -> dict[str, Any] | None:
            if isinstance(msg_or_type, dict):
                msg = msg_or_type
            else:
                msg = self.msg(msg_or_type, content, parent, header, metadata)
            if self.wire is None:  # the fork server's own warm-up cells: nobody to tell
                return msg
            parts = [
                json_packer(msg["header"]),
                json_packer(msg["parent_header"]),
                json_packer(msg.get("metadata") or {}),
                json_packer(msg.get("content") or {}),
            ]
            frames = jupyter_wire.serialize(parts, self.signer)
            frames += [bytes(b) for b in buffers or msg.get("buffers") or []]
            channel = stream if stream in jupyter_wire.STREAM_CHANNELS else "iopub"
            self.wire.send(channel, frames)
            return msg

        def read_request(self, frames: list[bytes]) -> dict[str, Any]:
            """A request, once its signature checks (ValueError if it does not)."""
            parts = jupyter_wire.verified_parts(frames, self.signer)
            header, parent, metadata, content = (json.loads(part) for part in parts[:4])
            return {
                "header": header,
                "parent_header": parent,
                "metadata": metadata,
                "content": content,
            }

    return StreamSession(key=b"-", signature_scheme="hmac-sha256", username="kernel")


class _Stream(io.TextIOBase):
    """`sys.stdout` or `sys.stderr` of a child: text goes to the request's output
    (`_Output`); `fileno()` is the pipe, so a subprocess given it is heard too."""

    def __init__(self, output: _Output, name: str, fd: int) -> None:
        self._output = output
        self._name = name
        self._fd = fd
        self._bytes: _Bytes | None = None

    encoding = "utf-8"
    errors = "replace"

    @property
    def name(self) -> str:
        return f"<{self._name}>"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._output.add(self._name, text)
        return len(text)

    def flush(self) -> None:
        self._output.send_pending()

    @property
    def buffer(self) -> _Bytes:
        """Bytes written here reach the output as UTF-8 text, as in a terminal."""
        if self._bytes is None:
            self._bytes = _Bytes(self)
        return self._bytes

    def reconfigure(self, **options: Any) -> None:
        """Accepted as in a terminal; the output stays UTF-8 text."""
        allowed = {"encoding", "errors", "newline", "line_buffering", "write_through"}
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(f"reconfigure() got an unexpected keyword argument {unknown.pop()!r}")
        self.flush()


class _Bytes(io.BufferedIOBase):
    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._stream.write(self._decoder.decode(view.tobytes()))
        return len(view)

    def flush(self) -> None:
        self._stream.flush()


class _Output:
    """A child's output, sent as `stream` messages of the current cell: what Python code
    writes (`_Stream`) and what reaches fds 1 and 2 (C libraries, subprocesses), read from
    their pipes by one thread. What piles up is sent as one message per stream every
    `TICK_SECONDS` (as ipykernel does every 0.2 s), at once past `FLUSH_CHARS`, on
    `flush()`, before any display message, and at the end of the cell."""

    def __init__(self, session: Any, log: Any) -> None:
        self.session = session
        self.log = log
        self.parent: dict[str, Any] = {}
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.reading = threading.Lock()
        self.pending: list[tuple[str, str]] = []
        self.size = 0
        self.partial: dict[int, str] = {}
        """A forked process's last line not ended yet, per fd."""
        os.register_at_fork(after_in_child=self._forked)
        self.pipes: dict[int, tuple[str, Any]] = {}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            os.set_blocking(read_end, False)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self.pipes[read_end] = (name, decoder)
        sys.stdout = _Stream(self, "stdout", 1)
        sys.stderr = _Stream(self, "stderr", 2)
        self.poller = select.poll()
        for read_end in self.pipes:
            self.poller.register(read_end, select.POLLIN)
        threading.Thread(target=self._forward, name="output", daemon=True).start()

    def _forked(self) -> None:
        """In a process the cell forked: the locks may have been held by a thread that is
        not there, and what is pending is the parent's to send."""
        self.lock = threading.Lock()
        self.reading = threading.Lock()
        self.pending, self.size = [], 0
        self.partial = {}

    def _write_fd(self, fd: int, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(fd, data) :]

    def add(self, name: str, text: str) -> None:
        if not text:
            return
        if os.getpid() != self.pid:  # a forked process: its fds lead to the kernel's pipes
            # Whole lines at a time (`print` writes its text and its newline apart): a line
            # is one write, never cut by the kernel's own output read in between.
            fd = 1 if name == "stdout" else 2
            text = self.partial.get(fd, "") + text
            cut = text.rfind("\n") + 1 if len(text) < FLUSH_CHARS else len(text)
            if cut:
                self._write_fd(fd, text[:cut])
            self.partial[fd] = text[cut:]
            return
        with self.lock:
            self.pending.append((name, text))
            self.size += len(text)
            if self.size >= FLUSH_CHARS:
                self._send_locked()

    def send_pending(self) -> None:
        if os.getpid() != self.pid:  # `flush()` in a forked process: its partial lines
            partial, self.partial = self.partial, {}
            for fd, text in partial.items():
                if text:
                    self._write_fd(fd, text)
            return
        with self.lock:
            self._send_locked()

    def _send_locked(self) -> None:
        pending, self.pending, self.size = self.pending, [], 0
        merged: list[tuple[str, list[str]]] = []
        for name, text in pending:
            if merged and merged[-1][0] == name:
                merged[-1][1].append(text)
            else:
                merged.append((name, [text]))
        for name, texts in merged:
            text = "".join(texts)
            if not text.isascii():  # a lone surrogate cannot be sent as UTF-8: replaced
                text = text.encode("utf-8", "replace").decode("utf-8")
            for at in range(0, len(text), MESSAGE_CHARS):  # one huge write: several messages
                content = {"name": name, "text": text[at : at + MESSAGE_CHARS]}
                self.session.send("iopub", "stream", content, self.parent)

    def _forward(self) -> None:
        while True:
            try:
                if self.poller.poll(TICK_SECONDS * 1000):
                    self.read_pipes()
                self.send_pending()
            except Exception:  # noqa: BLE001 - keep forwarding; the reason goes to the log
                traceback.print_exc(file=self.log)

    def read_pipes(self) -> None:
        """Take what the pipes hold now (the end of a cell calls this after flushing)."""
        with self.reading:  # one reader at a time: chunks stay in order, decoders whole
            self._read_pipes()

    def _read_pipes(self) -> None:
        for read_end, (name, decoder) in list(self.pipes.items()):
            while True:
                try:
                    data = os.read(read_end, READ_BYTES)
                except BlockingIOError:
                    break
                if not data:  # every writer closed it (code closed fd 1): done
                    self.poller.unregister(read_end)
                    del self.pipes[read_end]
                    break
                self.add(name, decoder.decode(data))

    def end_of_cell(self) -> None:
        self.read_pipes()
        self.send_pending()


def run_kernel(shell: Any, session: Any, prefix: str, key: str, log: Any) -> None:
    """Serve the request whose stream the gateway listens on at `<prefix>.sock`, signed
    with `key`, with the fork server's `shell` and `session` (`stream_session`); `log` is
    the container's log. Ends the process when the stream ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(prefix + ".sock")
    session.start(key.encode(), Wire(sock))
    output = _Output(session, log)
    _MiniKernel(shell, session, output).loop()


class _MiniKernel:
    """Answers kernel_info, execute and shutdown requests; SIGINT interrupts a cell. The
    gateway closing the stream ends the child."""

    def __init__(self, shell: Any, session: Any, output: _Output) -> None:
        self.shell = shell
        self.session = session
        self.output = output
        self.executing = False
        signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.executing:
            raise KeyboardInterrupt

    def status(self, state: str, parent: dict[str, Any]) -> None:
        self.session.send("iopub", "status", {"execution_state": state}, parent=parent)

    def loop(self) -> None:
        wire = self.session.wire
        while True:
            try:
                channel, frames = wire.receive()
            except (EOFError, OSError, ValueError):
                # The stream closed, or is no longer framed right (a `BadMessage`): nothing
                # after it can be read, so the kernel ends as the gateway's side does.
                os._exit(0)
            try:
                msg = self.session.read_request(frames)
            except Exception:  # noqa: BLE001 - not a message signed with our key: ignore it
                continue
            self.handle(channel, msg)

    def handle(self, channel: str, msg: dict[str, Any]) -> None:
        parent = msg["header"]
        msg_type = parent.get("msg_type")
        self.status("busy", parent)
        try:
            if msg_type == "kernel_info_request":
                self.session.send(channel, "kernel_info_reply", _kernel_info(), parent)
            elif msg_type == "execute_request":
                reply = self.execute(msg["content"], parent)
                self.session.send(channel, "execute_reply", reply, parent)
            elif msg_type == "shutdown_request":
                self.session.send(channel, "shutdown_reply", {"status": "ok"}, parent)
                self.status("idle", parent)
                self.session.wire.drain()
                os._exit(0)
        finally:
            self.status("idle", parent)

    def execute(self, content: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
        shell = self.shell
        code = str(content.get("code", ""))
        silent = bool(content.get("silent"))
        shell.set_parent(parent)
        self.output.parent = parent
        if not silent:
            self.session.send(
                "iopub",
                "execute_input",
                {"code": code, "execution_count": shell.execution_count},
                parent=parent,
            )
        self.executing = True
        try:
            result = shell.run_cell(code, store_history=not silent, silent=silent)
        except KeyboardInterrupt:
            result = None
        finally:
            self.executing = False
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - code replaced or closed it: nothing to flush
                pass
        self.output.end_of_cell()
        count = shell.execution_count - 1 if not silent else shell.execution_count
        payload = shell.payload_manager.read_payload()
        shell.payload_manager.clear_payload()
        if result is not None and result.success:
            return {
                "status": "ok",
                "execution_count": count,
                "payload": payload,
                "user_expressions": {},
            }
        error = result.error_in_exec or result.error_before_exec if result else None
        return {
            "status": "error",
            "execution_count": count,
            "ename": type(error).__name__ if error else "KeyboardInterrupt",
            "evalue": str(error) if error else "",
            "traceback": [],
            "payload": payload,
            "user_expressions": {},
        }


def _kernel_info() -> dict[str, Any]:
    import platform

    return {
        "status": "ok",
        "protocol_version": "5.3",
        "implementation": "kernel-gateway-stateless",
        "implementation_version": "1",
        "language_info": {
            "name": "python",
            "version": platform.python_version(),
            "mimetype": "text/x-python",
            "file_extension": ".py",
            "pygments_lexer": "ipython3",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "nbconvert_exporter": "python",
        },
        "banner": "",
        "help_links": [],
    }

"""The stateless fork server: runs inside a stateless kernel container, as root with a
handful of capabilities, and never runs user code itself.

Like `kernel_startup.py` it imports nothing from kernel_gateway: the gateway copies it,
with `startup.py` and `zygote.json`, into the container's connection folder.

Why: a stateless request used to pay for a new container, a Python start and the
preload (about 0.7 s of CPU). Here the preloaded interpreter and an IPython shell
are built once; each request is a `fork()` of that pristine process (copy-on-write,
a few milliseconds) that serves exactly one client as a small Jupyter kernel
(shell, control and IOPub over ipc sockets, signed with a key of its own), so the
gateway drives it with the same protocol and code as any other kernel.

What separates two requests in one container (one runs at a time):
- each child drops to a uid no earlier request had, with no capabilities, before it
  reads any request; it cannot signal, trace or read the fork server (root) and
  starts from the fork server's memory, which never held another request's code,
  output or key (the code arrives on the child's own socket);
- when a request ends, every process of its uid is killed (detached, double-forked,
  `setsid` ones included: the fork server is their subreaper), its SysV IPC objects
  are removed, and every place it could write (`/workspace`, `/tmp`, home,
  `/dev/shm`, `/dev/mqueue`, its socket folder) is emptied. Only then is the next
  child forked. Anything that cannot be verified clean is reported as `broken`
  and the gateway replaces the whole container.

The control protocol is JSON lines on `zygote.sock` (one gateway connection):
    zygote -> gateway  {"event": "ready"} | {"event": "forked", "pid"}
                       | {"event": "exited", "pid", "code", "signal", "oom"}
                       | {"event": "clean"} | {"event": "broken", "error"}
    gateway -> zygote  {"op": "fork", "prefix", "key"} | {"op": "signal", "signum"}
                       | {"op": "end"}
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
IPC_RMID = 0
IPC_PRIVATE = 0
IPC_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
KILL_SECONDS = 3.0
SUBSCRIBE_WAIT = 10.0


class Zygote:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.conn_dir: str = config["conn_dir"]
        self.writable: list[str] = config["writable"]
        self.uid_base: int = config["uid_base"]
        self.served = 0
        self.child: int | None = None
        self.child_dir: str | None = None
        self.uid: int | None = None
        self.oom_before = 0
        self.ipc_mark: dict[str, int] = {}
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.shell: Any = None
        self.inherited: list[Any] = []

    # -- the pristine process ----------------------------------------------------------------

    def prepare(self) -> None:
        """Import what every request would, and build the shell every child inherits."""
        # pyarrow's jemalloc (imported by pandas) starts a background thread: a process
        # that forks must have none (a lock held by it would stay held in every child).
        os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
        sys.path.insert(0, self.conn_dir)
        import startup  # type: ignore[import-not-found]  # kernel_startup.py, copied here

        startup._seed_font_cache()
        startup._install_tolerant_fd_capture()
        startup._install_thread_output_routing()
        startup._install_stdio_habits()
        startup._install_chart_habits()
        startup._install_offline_pip(bool(self.config.get("offline")))
        sys.path.remove(self.conn_dir)
        del sys.modules["startup"]

        import ipykernel.iostream  # noqa: F401
        import jupyter_client.session  # noqa: F401
        import zmq  # noqa: F401
        from ipykernel.zmqshell import ZMQInteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False  # one cell per kernel: no sqlite file
        formats = self.config.get("figure_formats")
        if formats:
            config.InlineBackend.figure_formats = set(formats)
        dpi = self.config.get("figure_dpi")
        if dpi:
            config.InlineBackend.print_figure_kwargs = {"bbox_inches": "tight", "dpi": dpi}
        self.shell = ZMQInteractiveShell.instance(config=config)
        preload = self.config.get("preload_code")
        if preload:
            self.shell.run_cell(preload, store_history=False, silent=True)
        # The first traceback imports and compiles IPython's formatting machinery: do it
        # here once, not in every child that raises.
        self.shell.run_cell("1/0", store_history=False, silent=True)
        self.shell.execution_count = 1
        self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        gc.collect()
        gc.freeze()  # children's collections then leave the shared pages unwritten
        threads = os.listdir("/proc/self/task")
        if len(threads) > 1:
            names = [_read(f"/proc/self/task/{t}/comm") for t in threads]
            print(f"fork server: threads besides the main one: {names}", file=sys.stderr)

    # -- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        path = os.path.join(self.conn_dir, "zygote.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        listener.bind(path)
        os.chmod(path, 0o600)  # the gateway (root on the host, with DAC override) only
        listener.listen(1)
        self._send_ready = True
        gateway, _ = listener.accept()
        listener.close()
        self.gateway = gateway
        self.send({"event": "ready"})
        selector = selectors.DefaultSelector()
        selector.register(gateway, selectors.EVENT_READ, "gateway")
        reaper_r, reaper_w = os.pipe()
        os.set_blocking(reaper_w, False)
        signal.set_wakeup_fd(reaper_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        selector.register(reaper_r, selectors.EVENT_READ, "sigchld")
        self.inherited = [selector, reaper_r, reaper_w]  # a child closes them at once
        buffer = b""
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "sigchld":
                    os.read(reaper_r, 4096)
                    continue
                data = gateway.recv(65536)
                if not data:  # the gateway went away: end everything
                    self.end()
                    return
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self.handle(json.loads(line))
            self.reap()

    def send(self, message: dict[str, Any]) -> None:
        self.gateway.sendall(json.dumps(message).encode() + b"\n")

    def handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "fork":
            self.fork(str(message["prefix"]), str(message["key"]))
        elif op == "signal" and self.child is not None:
            try:
                os.kill(self.child, int(message["signum"]))
            except ProcessLookupError:
                pass
        elif op == "end":
            self.end()

    def reap(self) -> None:
        """Collect every ended process (the fork server is the subreaper of them all)."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self._exited(pid, status, usage)

    def _exited(self, pid: int, status: int, usage: Any) -> None:
        self.child = None
        oom = self._oom_kills() > self.oom_before
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        cpu = round(usage.ru_utime + usage.ru_stime, 4)
        self.send(
            {
                "event": "exited",
                "pid": pid,
                "code": code,
                "signal": sig,
                "oom": oom,
                "cpu_seconds": cpu,
            }
        )

    # -- one request -------------------------------------------------------------------------

    def fork(self, prefix: str, key: str) -> None:
        if self.child is not None or self.uid is not None:
            self.send({"event": "broken", "error": "a fork was asked for before the last ended"})
            return
        self.served += 1
        uid = self.uid_base + self.served
        self.uid = uid
        child_dir = os.path.dirname(prefix)
        os.makedirs(child_dir, mode=0o700, exist_ok=True)
        os.chown(child_dir, uid, uid)
        for path in self.writable:
            _chown_tree(path, uid)
            os.chmod(path, 0o700)
        self.child_dir = child_dir
        self.oom_before = self._oom_kills()
        if not os.path.exists("/proc/sysvipc/shm"):
            self.ipc_mark = _ipc_mark(self.libc)
        pid = os.fork()
        if pid == 0:
            try:
                self._become(uid)
                _run_kernel(self.shell, prefix, key)
            except BaseException:
                import traceback

                traceback.print_exc(file=sys.__stderr__)
            finally:
                os._exit(1)
        self.child = pid
        self.send({"event": "forked", "pid": pid, "uid": uid})

    def _become(self, uid: int) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.gateway.close()
        selector, *pipe = self.inherited  # the fork server's: the child must not touch them
        selector.close()
        for fd in pipe:
            os.close(fd)
        os.setsid()
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # A uid change makes the process undumpable (its /proc files root's); it holds
        # nothing of anyone else's, so let it read its own /proc like any process.
        self.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        self.libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        os.umask(0o022)
        os.chdir("/workspace")

    def end(self) -> None:
        """Kill everything the request started and empty what it could write."""
        uid = self.uid
        if uid is None:
            self.send({"event": "clean"})
            return
        error = None
        try:
            self._kill_uid(uid)
            self.reap()
            if self.child is not None:  # killed, but not reaped yet
                pid, status, usage = os.wait4(self.child, 0)
                self._exited(pid, status, usage)
            self._wipe()
            left = _processes_of(uid)
            if left:
                error = f"processes of the request outlived it: {left[:5]}"
        except Exception as exc:  # noqa: BLE001 - any failure means: replace the container
            error = f"cleanup failed: {exc!r}"
        self.uid = None
        self.child_dir = None
        self.send({"event": "broken", "error": error} if error else {"event": "clean"})

    def _kill_uid(self, uid: int) -> None:
        """SIGKILL every process of `uid` until none is left (a process killed cannot
        fork again, so each round leaves at most what forked during the last one), then
        remove its SysV IPC objects."""
        deadline = time.monotonic() + KILL_SECONDS
        while time.monotonic() < deadline:
            alive = _processes_of(uid)
            if not alive:
                break
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)  # a killed process takes a moment to exit
            self.reap()
        self.reap()
        if os.path.exists("/proc/sysvipc/shm"):
            made = _ipc_objects_of(uid)
        else:  # gVisor: no listing, but ids only grow; what came between two marks is its
            made = _ipc_between(self.ipc_mark, _ipc_mark(self.libc))
        if made:
            self._as(uid, lambda: _remove_ipc(self.libc, made))

    def _as(self, uid: int, work: Any) -> None:
        """Run `work` in a helper process with `uid` (what only an owner may do)."""
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                work()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    def _wipe(self) -> None:
        for path in self.writable:
            _empty(path)
            os.chown(path, 0, 0)
            os.chmod(path, 0o755)
        if os.path.isdir("/dev/mqueue"):
            _empty("/dev/mqueue")
        if self.child_dir:
            shutil.rmtree(self.child_dir, ignore_errors=True)

    def _oom_kills(self) -> int:
        for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
            try:
                with open(path) as f:
                    for line in f:
                        name, _, value = line.partition(" ")
                        if name == "oom_kill":
                            return int(value)
            except OSError:
                continue
        return 0


# -- helpers -----------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def _chown_tree(root: str, uid: int) -> None:
    os.chown(root, uid, uid)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)


def _empty(root: str) -> None:
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _processes_of(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                with open(f"/proc/{name}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


def _ipc_objects_of(uid: int) -> list[tuple[str, int]]:
    """SysV shared memory segments, semaphore sets and message queues `uid` owns."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header, *lines = f.read().splitlines()
        except (OSError, ValueError):
            continue
        columns = header.split()
        for line in lines:
            row = dict(zip(columns, line.split(), strict=False))
            if row.get("uid") == str(uid) or row.get("cuid") == str(uid):
                found.append(
                    (kind, int(row[{"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind]]))
                )
    return found


def _ipc_mark(libc: Any) -> dict[str, int]:
    """The next SysV IPC id of each kind, found by making (and removing) one object."""
    made = {
        "shm": int(libc.shmget(IPC_PRIVATE, 1, 0o600)),
        "msg": int(libc.msgget(IPC_PRIVATE, 0o600)),
        "sem": int(libc.semget(IPC_PRIVATE, 1, 0o600)),
    }
    marks = {}
    for kind, ident in made.items():
        if ident >= 0:
            _remove_one(libc, kind, ident)
            marks[kind] = ident
    return marks


def _ipc_between(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, int]]:
    return [
        (kind, ident)
        for kind, start in before.items()
        for ident in range(start + 1, after.get(kind, start + 1))
    ]


def _remove_one(libc: Any, kind: str, ident: int) -> None:
    if kind == "shm":
        libc.shmctl(ident, IPC_RMID, None)
    elif kind == "sem":
        libc.semctl(ident, 0, IPC_RMID)
    else:
        libc.msgctl(ident, IPC_RMID, None)


def _remove_ipc(libc: Any, objects: list[tuple[str, int]]) -> None:
    """Remove SysV IPC objects (run as the request's uid: only an owner may, so an id
    that is not the request's is left alone)."""
    for kind, ident in objects:
        _remove_one(libc, kind, ident)


# -- the child: one client, one small Jupyter kernel -------------------------------------------


def _run_kernel(shell: Any, prefix: str, key: str) -> None:
    import zmq
    from ipykernel.iostream import IOPubThread, OutStream
    from jupyter_client.session import Session

    session = Session(key=key.encode(), signature_scheme="hmac-sha256", username="kernel")
    context = zmq.Context()
    shell_socket = context.socket(zmq.ROUTER)
    control = context.socket(zmq.ROUTER)
    iopub = context.socket(zmq.XPUB)
    for sock, port in (
        (shell_socket, "shell_port"),
        (control, "control_port"),
        (iopub, "iopub_port"),
    ):
        sock.linger = 1000
        sock.bind(f"ipc://{prefix}-{IPC_PORTS[port]}")
    subscribed = threading.Event()

    class IOPub(IOPubThread):
        """Notes when the gateway's SUB socket has subscribed (see `_MiniKernel.handle`)."""

        def _handle_subscription(self, frames: list[bytes]) -> None:
            super()._handle_subscription(frames)  # type: ignore[no-untyped-call]
            if any(frame[:1] == b"\x01" for frame in frames):
                subscribed.set()

    iopub_thread = IOPub(iopub, pipe=True, session=session)  # type: ignore[no-untyped-call]
    iopub_thread.start()  # type: ignore[no-untyped-call]
    pub = iopub_thread.background_socket
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout = OutStream(session, iopub_thread, "stdout", echo=None)  # type: ignore[no-untyped-call]
    sys.stderr = OutStream(session, iopub_thread, "stderr", echo=None)  # type: ignore[no-untyped-call]
    shell.displayhook.session = session
    shell.displayhook.pub_socket = pub
    shell.displayhook.topic = b"execute_result"
    shell.display_pub.session = session
    shell.display_pub.pub_socket = pub
    kernel = _MiniKernel(shell, session, pub, shell_socket, control, subscribed)
    kernel.loop()


class _MiniKernel:
    """Answers kernel_info, execute and shutdown requests; SIGINT interrupts a cell."""

    def __init__(
        self,
        shell: Any,
        session: Any,
        pub: Any,
        shell_socket: Any,
        control: Any,
        subscribed: threading.Event,
    ) -> None:
        self.shell = shell
        self.session = session
        self.pub = pub
        self.sockets = (shell_socket, control)
        self.subscribed = subscribed
        self.executing = False
        signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.executing:
            raise KeyboardInterrupt

    def status(self, state: str, parent: dict[str, Any]) -> None:
        self.session.send(self.pub, "status", {"execution_state": state}, parent=parent)

    def loop(self) -> None:
        import zmq

        poller = zmq.Poller()
        for sock in self.sockets:
            poller.register(sock, zmq.POLLIN)
        while True:
            for sock, _ in poller.poll():
                idents, msg = self.session.recv(sock, mode=0)
                if msg is not None:
                    self.handle(sock, idents, msg)

    def handle(self, sock: Any, idents: list[bytes], msg: dict[str, Any]) -> None:
        # The gateway sends its request at once, without the kernel_info handshake other
        # kernels need: output published before its subscription arrives would be lost,
        # so nothing is answered until it has (the XPUB socket tells).
        self.subscribed.wait(SUBSCRIBE_WAIT)
        parent = msg["header"]
        msg_type = parent.get("msg_type")
        self.status("busy", parent)
        try:
            if msg_type == "kernel_info_request":
                self.session.send(sock, "kernel_info_reply", _kernel_info(), parent, ident=idents)
            elif msg_type == "execute_request":
                reply = self.execute(msg["content"], parent)
                self.session.send(sock, "execute_reply", reply, parent, ident=idents)
            elif msg_type == "shutdown_request":
                self.session.send(sock, "shutdown_reply", {"status": "ok"}, parent, ident=idents)
                os._exit(0)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            self.status("idle", parent)

    def execute(self, content: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
        shell = self.shell
        code = str(content.get("code", ""))
        silent = bool(content.get("silent"))
        shell.set_parent(parent)
        if not silent:
            self.session.send(
                self.pub,
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
        sys.stdout.flush()
        sys.stderr.flush()
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


def main(argv: list[str]) -> None:
    with open(argv[0]) as f:
        config = json.load(f)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = Zygote(config)
    zygote.prepare()
    zygote.serve()


if __name__ == "__main__":
    main(sys.argv[1:])

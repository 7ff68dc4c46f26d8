"""The stateless fork server: runs inside a stateless kernel container, as root with a
handful of capabilities, and never runs user code itself.

Like `kernel_startup.py` it imports nothing from kernel_gateway: the gateway copies it,
with `startup.py` and `zygote.json`, into the container's connection folder.

Why: a stateless request used to pay for a new container, a Python start and the
preload (about 0.7 s of CPU). Here the preloaded interpreter and an IPython shell
are built once; each request is a `fork()` of that pristine process (copy-on-write,
a few milliseconds) that serves exactly one client as a small Jupyter kernel
(the same signed messages, with a key of its own, on one Unix stream instead of ZMQ
sockets: see "the child" below), so the gateway drives it with the same protocol and
code as any other kernel.

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

import codecs
import ctypes
import datetime
import gc
import hashlib
import hmac
import io
import json
import os
import queue
import resource  # noqa: F401 - os.wait4 imports it on first use: here, before the freeze
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import uuid
from typing import Any

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
IPC_RMID = 0
IPC_PRIVATE = 0
IPC_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
KILL_SECONDS = 3.0


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
        self.log = os.fdopen(os.dup(2), "w", buffering=1)
        """The container's log (fd 2 of the fork server): a child's fds 1 and 2 are its
        request's output."""
        self.shell: Any = None
        self.session: Any = None
        self.inherited: list[Any] = []
        """What a child closes at once: sockets, selectors and fds of its fork server."""
        self.full: _FullTemplate | None = None
        """The full template, when this process is the light one (see `_start_full`)."""
        self.child_from_full = False

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

        import jupyter_client.session  # noqa: F401
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
        # Every child's session (it gets its key, id and stream in the child); until then
        # what IPython publishes goes nowhere.
        self.session = _session()
        for hook in (self.shell.displayhook, self.shell.display_pub):
            hook.session = self.session
            hook.pub_socket = "iopub"
        self.shell.displayhook.topic = b"execute_result"
        preload = self.config.get("preload_code")
        if preload:
            self.shell.run_cell(preload, store_history=False, silent=True)
        # The first traceback imports and compiles IPython's formatting machinery: do it
        # here once, not in every child that raises.
        self.shell.run_cell("1/0", store_history=False, silent=True)
        # IPython builds its `%logstart` logger on a cell's first stored input: an import
        # every child would repeat (about 0.4 ms of a `print(1)` request).
        _ = self.shell.logger
        self.shell.execution_count = 1
        self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        gc.collect()
        _immortalize()  # children then leave the counts of what they read unwritten
        gc.freeze()  # and their collections leave the shared pages unwritten
        sys.stdout.flush()  # nothing of the fork server's own output may reach a request
        sys.stderr.flush()
        _warn_of_threads("fork server")
        full = self.config.get("full_preload_code")
        if full:
            self.full = self._start_full(str(full))

    # -- the full template -------------------------------------------------------------------

    def _start_full(self, code: str) -> _FullTemplate | None:
        """Fork the full template: this pristine process with the rest of the preload
        (pandas) on top. Cells that may need it are forked from it; the others from this
        light one, whose forks are cheaper (fewer mappings to copy and to tear down).
        None if it does not come up: every cell is then forked here."""
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                self._serve_full(theirs, code)
            except BaseException:
                traceback.print_exc(file=self.log)
            finally:
                os._exit(1)
        theirs.close()
        template = _FullTemplate(pid, ours)
        if template.ready(float(self.config.get("full_start_seconds", FULL_START_SECONDS))):
            return template
        print("fork server: the full template did not start; one template", file=self.log)
        template.close()
        return None

    def _serve_full(self, sock: socket.socket, code: str) -> None:
        """The full template's life: preload the rest, then fork a child for each order
        of the light template (it has made the uid's places) and report each end."""
        self.shell.run_cell(code, store_history=False, silent=True)
        self.shell.execution_count = 1
        gc.collect()
        _immortalize()  # what the light template froze is immortal already: not entered
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        _warn_of_threads("the full template")
        selector, reaper_r = self._selector(sock, "light")
        sock.sendall(b'{"event": "ready"}\n')
        buffer = b""
        while True:
            for key, _ in selector.select():
                if key.data == "sigchld":
                    os.read(reaper_r, 4096)
                    for pid, status, cpu in _ended_children():
                        report = {"event": "exited", "pid": pid, "status": status, "cpu": cpu}
                        sock.sendall(json.dumps(report).encode() + b"\n")
                    continue
                data = sock.recv(65536)
                if not data:  # the light template (the fork server) is gone
                    os._exit(0)
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    order = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        self._run_child(int(order["uid"]), order["prefix"], order["key"])
                    sock.sendall(json.dumps({"event": "forked", "pid": pid}).encode() + b"\n")

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
        selector, reaper_r = self._selector(gateway, "gateway")
        if self.full is not None:
            selector.register(self.full.sock, selectors.EVENT_READ, "full")
            self.inherited.append(self.full.sock)
        buffer = b""
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "sigchld":
                    os.read(reaper_r, 4096)
                    continue
                if key.data == "full":
                    if self.full is not None and not self.full.receive(0):
                        selector.unregister(self.full.sock)
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

    def _selector(self, sock: socket.socket, name: str) -> tuple[selectors.BaseSelector, int]:
        """A selector for `sock` (its data `name`) and for ended children ("sigchld": the
        read end of the signal's wakeup pipe, returned); all of it is what a child closes."""
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ, name)
        reaper_r, reaper_w = os.pipe()
        os.set_blocking(reaper_w, False)
        signal.set_wakeup_fd(reaper_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        selector.register(reaper_r, selectors.EVENT_READ, "sigchld")
        self.inherited = [sock, selector, reaper_r, reaper_w]
        return selector, reaper_r

    def send(self, message: dict[str, Any]) -> None:
        self.gateway.sendall(json.dumps(message).encode() + b"\n")

    def handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "fork":
            self.fork(str(message["prefix"]), str(message["key"]), bool(message.get("light")))
        elif op == "signal" and self.child is not None:
            try:
                os.kill(self.child, int(message["signum"]))
            except ProcessLookupError:
                pass
        elif op == "end":
            self.end()

    def reap(self) -> None:
        """Collect every ended process (the fork server is the subreaper of them all;
        the full template reaps its own children and reports their ends)."""
        for pid, status, cpu in _ended_children():
            if pid == self.child:
                self._exited(pid, status, cpu)
            elif self.full is not None and pid == self.full.pid:
                self.full.receive(0)  # what it reported before it ended
                self.full.alive = False
                print("fork server: the full template ended", file=self.log)
        full = self.full
        if full is not None:
            full.receive(0)
            if self.child is not None and self.child in full.exits:
                self._exited(self.child, *full.exits.pop(self.child))

    def _exited(self, pid: int, status: int, cpu: float) -> None:
        self.child = None
        oom = self._oom_kills() > self.oom_before
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
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

    def fork(self, prefix: str, key: str, light: bool) -> None:
        if self.child is not None or self.uid is not None:
            self.send({"event": "broken", "error": "a fork was asked for before the last ended"})
            return
        self.served += 1
        uid = self.uid_base + self.served
        self.uid = uid
        child_dir = os.path.dirname(prefix)
        os.makedirs(child_dir, mode=0o700, exist_ok=True)
        os.chown(child_dir, uid, uid)
        if os.path.exists(prefix + ".sock"):  # the gateway listens there for the child
            os.chown(prefix + ".sock", uid, uid, follow_symlinks=False)
        for path in self.writable:
            _chown_tree(path, uid)
            os.chmod(path, 0o700)
        self.child_dir = child_dir
        self.oom_before = self._oom_kills()
        if not os.path.exists("/proc/sysvipc/shm"):
            self.ipc_mark = _ipc_mark(self.libc)
        full = self.full if not light and self.full is not None and self.full.alive else None
        pid = None
        if full is not None:
            try:
                pid = full.fork(uid, prefix, key)
            except (OSError, ValueError, KeyError) as exc:
                print(f"fork server: the full template failed: {exc!r}", file=self.log)
                full.close()  # a late fork of its own must not race the one made here
                self._kill_uid(uid)
        if pid is None:
            full = None
            pid = os.fork()
            if pid == 0:
                self._run_child(uid, prefix, key)
        self.child = pid
        self.child_from_full = full is not None
        template = (
            "full" if full is not None or not self.config.get("full_preload_code") else "light"
        )
        self.send({"event": "forked", "pid": pid, "uid": uid, "template": template})

    def _run_child(self, uid: int, prefix: str, key: str) -> None:
        """In a new child: become the request's uid and serve it; never returns."""
        try:
            self._become(uid)
            _run_kernel(self.shell, self.session, prefix, key, self.log)
        except BaseException:
            traceback.print_exc(file=self.log)  # the container's log, not the request's
        finally:
            os._exit(1)

    def _become(self, uid: int) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for item in self.inherited:  # the fork server's: the child must not touch them
            if isinstance(item, int):
                os.close(item)
            else:
                item.close()
        os.setsid()
        try:  # the out-of-memory killer takes a request before a template
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("500")
        except OSError:
            pass
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
            if self.child is not None and self.child_from_full and self.full is not None:
                self.full.wait_exit(self.child, KILL_SECONDS)  # killed, not reported yet
                self.reap()
            if self.child is not None and not self.child_from_full:  # killed, not reaped yet
                pid, status, usage = os.wait4(self.child, 0)
                self._exited(pid, status, round(usage.ru_utime + usage.ru_stime, 4))
            if self.child is not None:
                error = "the request's process did not end"
            self._wipe()
            left = _processes_of(uid)
            if left:
                error = f"processes of the request outlived it: {left[:5]}"
            if self.full is not None and not self.full.alive:
                error = error or "the full template ended"
        except Exception as exc:  # noqa: BLE001 - any failure means: replace the container
            error = f"cleanup failed: {exc!r}"
        self.uid = None
        self.child_dir = None
        if self.full is not None:
            self.full.exits.clear()
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


FULL_START_SECONDS = 15.0
"""How long the full template may take to preload, unless the gateway says (it gives the
whole fork server `--kernel-start-timeout`)."""


def _warn_of_threads(who: str) -> None:
    """A process that forks must have one thread (a lock another holds would stay held
    in every child): say so in the container's log if it has more."""
    threads = os.listdir("/proc/self/task")
    if len(threads) > 1:
        names = [_read(f"/proc/self/task/{t}/comm") for t in threads]
        print(f"{who}: threads besides the main one: {names}", file=sys.stderr)


def _ended_children() -> list[tuple[int, int, float]]:
    """(pid, wait status, CPU seconds) of every ended child, collected now."""
    ended: list[tuple[int, int, float]] = []
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status, round(usage.ru_utime + usage.ru_stime, 4)))


class _FullTemplate:
    """The light template's end of the full one (its child): JSON lines on a socket
    pair, orders out (`{"uid", "prefix", "key"}`), answers and ends in
    (`{"event": "ready" | "forked", "pid"}`, `{"event": "exited", "pid", "status", "cpu"}`)."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.alive = True
        self.buffer = b""
        self.answers: list[dict[str, Any]] = []
        self.exits: dict[int, tuple[int, float]] = {}

    def receive(self, timeout: float) -> bool:
        """Take in what has come, waiting up to `timeout`; False once it is gone."""
        if not self.alive:
            return False
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, TimeoutError):
            return True
        except OSError:
            data = b""
        if not data:
            self.alive = False
            return False
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            message = json.loads(line)
            if message.get("event") == "exited":
                self.exits[int(message["pid"])] = (int(message["status"]), float(message["cpu"]))
            else:
                self.answers.append(message)
        return True

    def _answer(self, seconds: float) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while not self.answers:
            left = deadline - time.monotonic()
            if left <= 0 or not self.receive(left):
                raise OSError("the full template did not answer")
        return self.answers.pop(0)

    def ready(self, seconds: float) -> bool:
        try:
            return self._answer(seconds).get("event") == "ready"
        except OSError:
            return False

    def fork(self, uid: int, prefix: str, key: str) -> int:
        self.sock.settimeout(KILL_SECONDS)
        self.sock.sendall(json.dumps({"uid": uid, "prefix": prefix, "key": key}).encode() + b"\n")
        return int(self._answer(KILL_SECONDS)["pid"])

    def wait_exit(self, pid: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while pid not in self.exits and self.receive(max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                return

    def close(self) -> None:
        self.alive = False
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


IMMORTAL_REFCOUNT = 0xFFFFFFFF
"""CPython 3.12 and 3.13 (64-bit, with the GIL): an object whose count's low 32 bits are all
ones is immortal (PEP 683): its count is never written again, and it is never freed."""


def _immortalize() -> int:
    """Make what the fork server holds immortal before the first fork; return how many.

    A child that only reads a preloaded object (a module's function, a class, a
    constant) still writes its reference count, and the first write to each page it
    shares with the fork server copies the page: about 600 of a request's 1,500 page
    faults. The fork server never lets go of what it preloaded and a child lives for
    one request, so never freeing these objects costs nothing. Every object the
    collector tracks is made immortal, with the untracked ones (strings, numbers,
    tuples of them) they refer to; an object already immortal is not entered again,
    so the walk needs no memory of its own (a set of ids would itself grow the heap
    that every fork copies). Other Pythons are left as they are.
    """
    if (
        sys.implementation.name != "cpython"
        or sys.version_info[:2] not in ((3, 12), (3, 13))
        or ctypes.sizeof(ctypes.c_void_p) != 8
        or sysconfig.get_config_var("Py_GIL_DISABLED")  # counts laid out otherwise
        or hasattr(sys, "gettotalrefcount")  # a debug build: its objects start otherwise
    ):
        return 0
    made = 0
    for tracked in gc.get_objects():
        pending = [tracked]
        while pending:
            obj = pending.pop()
            count = ctypes.c_ssize_t.from_address(id(obj))
            if not 0 < count.value < IMMORTAL_REFCOUNT:
                continue  # already immortal (or not an object count: leave it)
            count.value = IMMORTAL_REFCOUNT
            made += 1
            pending.extend(o for o in gc.get_referents(obj) if not gc.is_tracked(o))
    return made


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
#
# A child serves one request and ends, so what a long-lived kernel sets up once (a ZMQ
# context and its I/O thread, three sockets, ipykernel's IOPub thread with its event loop,
# output streams with a watcher thread each) would be most of a request's cost. Instead:
# - one Unix stream to the gateway, which listens on `<prefix>.sock` before the fork, so
#   the child connects once and nothing waits for a subscription; on it, the same signed
#   Jupyter messages, each framed as a record naming its channel (the gateway's
#   kernels/wire.py `stream_record`: `_record` below must stay the same);
# - `sys.stdout`/`sys.stderr` collect text, and file descriptors 1 and 2 are pipes (C
#   libraries' and subprocesses' output) read by one thread, which sends what piled up as
#   one `stream` message per stream every 50 ms; the end of a cell sends the rest before
#   its reply (`_Output`).

RECORD_HEAD = struct.Struct("!IcH")
FRAME_SIZE = struct.Struct("!I")
CHANNEL_TAGS = {"shell": b"s", "control": b"c", "iopub": b"i"}
TAG_CHANNELS = {tag: name for name, tag in CHANNEL_TAGS.items()}
READ_BYTES = 65536
MESSAGE_CHARS = 1 << 20
DELIM = b"<IDS|MSG>"
TICK_SECONDS = 0.05
FLUSH_CHARS = 64 * 1024


def _record(channel: str, frames: list[bytes]) -> bytes:
    body = b"".join(FRAME_SIZE.pack(len(frame)) + frame for frame in frames)
    return RECORD_HEAD.pack(len(body), CHANNEL_TAGS[channel], len(frames)) + body


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


class _Wire:
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
            self.queue.put(_record(channel, frames))  # one C call: whole or not at all

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
        length, tag, count = RECORD_HEAD.unpack(_recv_exactly(self.sock, RECORD_HEAD.size))
        body = _recv_exactly(self.sock, length)
        frames, at = [], 0
        for _ in range(count):
            (size,) = FRAME_SIZE.unpack_from(body, at)
            frames.append(body[at + 4 : at + 4 + size])
            at += 4 + size
        return TAG_CHANNELS.get(tag, "shell"), frames


def _session() -> Any:
    """What IPython's display hook and publisher use of jupyter_client's Session (`msg`,
    `send`; they accept only a Session), and what the child needs to read a request, with
    nothing per request going through traitlets: signed with the request's key
    (HMAC-SHA256 over the four JSON parts, as wire.py checks) and sent on the child's
    stream, where the "socket" IPython hands `send` names the channel. Built in the fork
    server; `start` gives it a request's key, id and stream in the child."""
    from jupyter_client.session import Session, extract_header, json_packer

    class StreamSession(Session):
        wire: _Wire | None = None
        sid = ""

        def start(self, key: bytes, wire: _Wire) -> None:
            self.mac = hmac.new(key, digestmod=hashlib.sha256)
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
            mac = self.mac.copy()
            for part in parts:
                mac.update(part)
            return mac.hexdigest().encode()

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
            frames = [DELIM, self.sign(parts), *parts]
            frames += [bytes(b) for b in buffers or msg.get("buffers") or []]
            self.wire.send(stream if stream in CHANNEL_TAGS else "iopub", frames)
            return msg

        def read_request(self, frames: list[bytes]) -> dict[str, Any]:
            """A request, once its signature checks (ValueError if it does not)."""
            at = frames.index(DELIM)
            parts = frames[at + 2 : at + 6]
            if len(parts) < 4 or not hmac.compare_digest(self.sign(parts), frames[at + 1]):
                raise ValueError("not a message signed with this request's key")
            header, parent, metadata, content = (json.loads(part) for part in parts)
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

    def add(self, name: str, text: str) -> None:
        if not text:
            return
        if os.getpid() != self.pid:  # a forked process: its fds lead to the kernel's pipes
            data = text.encode("utf-8", "replace")
            fd = 1 if name == "stdout" else 2
            while data:
                data = data[os.write(fd, data) :]
            return
        with self.lock:
            self.pending.append((name, text))
            self.size += len(text)
            if self.size >= FLUSH_CHARS:
                self._send_locked()

    def send_pending(self) -> None:
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


def _run_kernel(shell: Any, session: Any, prefix: str, key: str, log: Any) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(prefix + ".sock")
    session.start(key.encode(), _Wire(sock))
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
            except (EOFError, OSError):
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


ALLOCATOR = {"PYTHONMALLOC": "mimalloc"}
"""How the fork server's Python allocates, where it can (CPython 3.13 has its own copy of
mimalloc, also the faster allocator for user code here)."""
HUGE_PAGES = {"MIMALLOC_LARGE_OS_PAGES": "1"}
"""Where the host suits it (`_huge_pages_suit`): mimalloc's memory in transparent huge
pages. After the preload nearly all of the heap is then in 2 MiB pages: a fork shares
it as a few dozen entries instead of tens of thousands, and a child's exit frees as few
(docs/performance.md). mimalloc keeps such memory (it does not give it back to the
system while the process lives): a child lives for one request."""
REEXECUTED = "KG_FORK_SERVER_ALLOCATOR"
"""Set on the run again, with the values the variables had before (JSON)."""


def _huge_pages_suit() -> bool:
    """Transparent huge pages on offer (`madvise` or `always`), no reserved huge pages
    (mimalloc would take them first: outside the memory limit, never split, a SIGBUS
    once used up), and a kernel that splits a shared huge page on a child's first write
    instead of copying all 2 MiB of it (5.8 and later)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return False
        root = "/sys/kernel/mm/hugepages"
        for size in os.listdir(root):
            with open(os.path.join(root, size, "nr_hugepages")) as f:
                if int(f.read().strip() or 0):
                    return False
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except (OSError, ValueError):
        return False
    return (major, minor) >= (5, 8)


def _choose_allocator() -> None:
    """Run this fork server again under `ALLOCATOR` (read only when a Python starts) if
    its Python accepts it; the children's environment is then put back as it was."""
    before = os.environ.pop(REEXECUTED, None)
    if before is not None:
        for name, value in json.loads(before).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        return
    if sys.version_info < (3, 13):
        return  # no mimalloc: an unknown PYTHONMALLOC would stop Python at start
    wanted = {**ALLOCATOR, **(HUGE_PAGES if _huge_pages_suit() else {})}
    saved = json.dumps({name: os.environ.get(name) for name in wanted})
    env = {**os.environ, **wanted, REEXECUTED: saved}
    try:
        check = subprocess.run(
            [sys.executable, "-c", "pass"], env=env, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return
    if check.returncode == 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [*sys.orig_argv], env)


def main(argv: list[str]) -> None:
    _choose_allocator()
    with open(argv[0]) as f:
        config = json.load(f)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = Zygote(config)
    zygote.prepare()
    zygote.serve()
    # Everything is ended and emptied; nothing is left to flush or free (and an
    # interpreter's finalization would walk the immortal objects for nothing).
    zygote.log.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

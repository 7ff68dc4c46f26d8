"""The fork server: a preloaded interpreter and IPython shell, built once (`prepare`),
forked for each request (`fork`); the child serves the request (`mini_kernel.py`) and
what it left is killed and emptied before the next (`fork_cleanup.py`).

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
import resource  # noqa: F401 - os.wait4 imports it on first use: here, before the freeze
import selectors
import signal
import socket
import sys
import sysconfig
import time
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # in the gateway's package
    from . import fork_cleanup, mini_kernel
else:  # in a container's folder, beside this file
    import fork_cleanup
    import mini_kernel

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
KILL_SECONDS = fork_cleanup.KILL_SECONDS


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
        self.session = mini_kernel.stream_session()
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
        oom = fork_cleanup.oom_kills() > self.oom_before
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
        fork_cleanup.hand_over(self.writable, uid)
        self.child_dir = child_dir
        self.oom_before = fork_cleanup.oom_kills()
        if not os.path.exists("/proc/sysvipc/shm"):
            self.ipc_mark = fork_cleanup.ipc_mark(self.libc)
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
            mini_kernel.run_kernel(self.shell, self.session, prefix, key, self.log)
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
        os.chdir("/home/user")

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
            fork_cleanup.wipe(self.writable, self.child_dir)
            left = fork_cleanup.processes_of(uid)
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
        """Kill every process of `uid` and remove its SysV IPC objects (`fork_cleanup`)."""
        fork_cleanup.kill_uid(uid, self.libc, self.ipc_mark, self.reap)


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

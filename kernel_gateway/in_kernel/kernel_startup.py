"""Runs inside the kernel's own Python, before ipykernel starts (both backends).

It must import nothing from kernel_gateway: in a container it is a lone file
copied next to the connection file. It works with ipykernel 6 and 7.

Thread output: ipykernel tags whatever a background thread prints with the
parent of the cell running *now*, so a thread started by one cell would print
into the next cell's stream. Here each thread remembers the cell that started
it and its output is published under that cell's parent; the gateway routes by
parent, so the output reaches the right execution, or nobody once it is done.

Habits of generated code that work in a plain `python script.py` and would fail only
here are made to work too (`_install_stdio_habits`, `_install_chart_habits`), and
`pip install` in a kernel without network fails at once with a way forward
(`_install_offline_pip`).
"""

from __future__ import annotations

import codecs
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

FLUSH_CHARS = 64 * 1024
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
PIP_INSTALL = re.compile(r"\bpip(?:3(?:\.\d+)?)?\s+install\b")
PIP_HINT = (
    "pip cannot download packages in this kernel: it has no network access. "
    "What is installed: `pip list`. To add a package, whoever runs the gateway bakes it "
    "into the kernel image (`kernel-gateway build-image --requirements FILE`) or builds "
    "an image FROM kernel-gateway-kernel and serves it with `--image`."
)


def _buffered(stream: Any) -> int:
    """Characters an ipykernel OutStream holds unsent."""
    buffer = getattr(stream, "_buffer", None)  # ipykernel 6: one buffer
    if buffer is not None:
        return int(buffer.tell())
    buffers = getattr(stream, "_buffers", None)  # ipykernel 7: one per parent header
    if not isinstance(buffers, dict):
        return 0
    size = 0
    for buffer in list(buffers.values()):  # the IOPub thread may swap the dict meanwhile
        try:
            size += int(buffer.tell())
        except ValueError:  # closed by the IOPub thread once sent
            pass
    return size


def _install_thread_output_routing() -> None:
    from ipykernel.iostream import OutStream

    local = threading.local()
    original_write = OutStream.write
    original_start = threading.Thread.start

    def current_parent() -> dict[str, Any] | None:
        origin: dict[str, Any] | None = getattr(local, "origin", None)
        if origin is not None:
            return origin
        header = getattr(sys.stdout, "parent_header", None)
        # An empty header means "no cell" (ipykernel's own threads): leave those alone.
        return dict(header) if isinstance(header, dict) and header else None

    def start(self: threading.Thread, *args: Any, **kwargs: Any) -> None:
        origin = current_parent()
        if origin is not None:
            run = self.run

            def run_with_origin() -> None:
                local.origin = origin
                run()

            self.run = run_with_origin  # type: ignore[method-assign]
        original_start(self, *args, **kwargs)

    def write(self: Any, string: str) -> int | None:
        origin = getattr(local, "origin", None)
        if origin is None or self.pub_thread is None or not isinstance(string, str):
            written = original_write(self, string)
            # ipykernel sends what was written in each 0.2 s as one message, however
            # large: a tight print loop makes messages of tens of MB that the gateway
            # must decode whole. Flushing past FLUSH_CHARS bounds every message, and
            # the writer waits for the send, so output cannot outrun its consumer.
            if _buffered(self) > FLUSH_CHARS and self._is_master_process():
                self.flush()
            return written
        if string:
            session, pub, topic = self.session, self.pub_thread, self.topic
            msg = session.msg("stream", {"name": self.name, "text": string}, parent=origin)
            pub.schedule(lambda: session.send(pub, msg, ident=topic))
        return len(string)

    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        # Pool workers outlive the cell that started them: take the cell that submits.
        origin = current_parent()

        def call(*a: Any, **k: Any) -> Any:
            previous = getattr(local, "origin", None)
            local.origin = origin
            try:
                return fn(*a, **k)
            finally:
                local.origin = previous

        return original_submit(self, call, *args, **kwargs)

    def publish(
        self: Any,
        data: Any,
        metadata: Any = None,
        transient: Any = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        origin = getattr(local, "origin", None)
        if origin is None:
            original_publish(  # type: ignore[no-untyped-call]
                self, data, metadata, transient=transient, update=update, **kwargs
            )
            return
        content = {
            "data": encode_images(data),  # type: ignore[no-untyped-call]
            "metadata": metadata or {},
            "transient": transient or {},
        }
        msg_type = "update_display_data" if update else "display_data"
        clean = json_clean(content)  # type: ignore[no-untyped-call]
        msg = self.session.msg(msg_type, clean, parent=origin)
        self.session.send(self.pub_socket, msg, ident=self.topic)

    from concurrent.futures import ThreadPoolExecutor

    from ipykernel.jsonutil import encode_images, json_clean
    from ipykernel.zmqshell import ZMQDisplayPublisher

    original_submit = ThreadPoolExecutor.submit
    original_publish = ZMQDisplayPublisher.publish
    threading.Thread.start = start  # type: ignore[method-assign]
    OutStream.write = write  # type: ignore[method-assign]
    ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]
    ZMQDisplayPublisher.publish = publish  # type: ignore[method-assign]


OUTCOMES_KEPT = 64


def _install_outcome_log() -> None:
    """Remember how the last cells ended, by the msg_id of the request that ran each.

    A gateway that stops while a cell runs never gets that cell's execute_reply: it
    goes to the old gateway's socket. The gateway that adopts the kernel evaluates
    `get_ipython().kernel._kg_outcomes.get(msg_id)` (a user expression of a silent
    request) to learn it. Silent requests are not recorded.
    """
    from collections import OrderedDict

    from ipykernel.ipkernel import IPythonKernel

    original_init: Any = IPythonKernel.__init__

    def __init__(self: Any, **kwargs: Any) -> None:
        original_init(self, **kwargs)
        outcomes: OrderedDict[str, str] = OrderedDict()

        def post_run_cell(result: Any) -> None:
            header = getattr(sys.stdout, "parent_header", None)
            msg_id = header.get("msg_id") if isinstance(header, dict) else None
            if not isinstance(msg_id, str):
                return
            outcomes[msg_id] = json.dumps(
                {
                    "status": "ok" if result.success else "error",
                    "execution_count": result.execution_count,
                }
            )
            while len(outcomes) > OUTCOMES_KEPT:
                outcomes.popitem(last=False)

        self.shell.events.register("post_run_cell", post_run_cell)
        self._kg_outcomes = outcomes

    IPythonKernel.__init__ = __init__  # type: ignore[method-assign]


def _install_lossless_iopub() -> None:
    """IOPub's PUB socket queues without limit here, where the kernel's own memory pays.

    ZMQ's PUB drops messages past its high-water mark (1,000 messages) when the gateway
    reads slower than the code prints; the one dropped could be the `idle` status that
    ends the cell. The gateway's side holds few messages (kernels/channels.py), so a
    flood of output waits in the sandbox, under its memory limit, not in the gateway.
    """
    import zmq
    from ipykernel.kernelapp import IPKernelApp

    original: Any = IPKernelApp.init_iopub

    def init_iopub(self: Any, context: Any) -> None:
        context.setsockopt(zmq.SNDHWM, 0)  # the default of sockets made from now on
        try:
            original(self, context)
        finally:
            context.sockopts.pop(zmq.SNDHWM, None)

    IPKernelApp.init_iopub = init_iopub  # type: ignore[method-assign]


def _settings(connection_file: str) -> dict[str, Any]:
    """`startup.json`, written by the gateway beside the connection file."""
    path = os.path.join(os.path.dirname(connection_file), "startup.json")
    try:
        with open(path) as f:
            settings = json.load(f)
    except (OSError, ValueError):
        return {}
    return settings if isinstance(settings, dict) else {}


def _config(settings: dict[str, Any]) -> Any:
    """Kernel configuration from the gateway's settings."""
    from traitlets.config import Config

    config = Config()
    # IPython keeps its history in a SQLite file written by a background thread: about
    # 0.7 ms on every cell (bench/cell_work.py), and a thread that prints its own
    # failures (a cell that used up its file descriptors) into the next cell's output.
    # In memory, `In`, `Out`, `_i` and `%history` work the same for the kernel's life.
    config.HistoryManager.hist_file = ":memory:"
    # Figures' and tables' data beside their pictures: E2B's `Result.chart` and `.data`.
    if _import_beside("kg_chart_data"):
        config.IPKernelApp.extensions = ["kg_chart_data"]
    formats = settings.get("figure_formats")
    if formats:
        config.InlineBackend.figure_formats = set(formats)
    dpi = settings.get("figure_dpi")
    if dpi:
        config.InlineBackend.print_figure_kwargs = {"bbox_inches": "tight", "dpi": dpi}
    return config


def _import_beside(name: str) -> bool:
    """Import the module `<name>.py` the gateway wrote beside this file (its folder is not
    on `sys.path`, and stays off it: code must not import the connection folder's files);
    False if there is none."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    if not os.path.exists(path) or spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return True


def _seed_font_cache() -> None:
    """Start from a prebuilt matplotlib font cache: a cold font scan costs seconds."""
    source = os.environ.get("MPL_FONT_CACHE_SEED")
    target = os.environ.get("MPLCONFIGDIR")
    if not source or not target or not os.path.isdir(source):
        return
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(source):
        if name.endswith(".json") and not os.path.exists(os.path.join(target, name)):
            shutil.copy(os.path.join(source, name), target)


def _install_tolerant_fd_capture() -> None:
    """Keep fd-level output flowing whatever bytes a program writes, and in its own cell.

    ipykernel decodes what it reads from the stdout/stderr pipes without regard for
    characters split across reads (and ipykernel 6 strictly: one invalid UTF-8 byte from a
    subprocess ended its watcher thread, and all later C-level and subprocess output of the
    kernel was lost). This version decodes incrementally and replaces invalid bytes.

    It also closes a race: the kernel flushes its streams before it says a cell is done, but
    what a subprocess wrote to the pipe reached the stream only when the watcher thread got
    to read it, which on a busy machine was after the cell had ended (its output lost or
    shown in the next cell). `flush` now first waits (up to `DRAIN_SECONDS`) until the
    watcher has passed on every byte that was in the pipe, or taken from it, when it began.
    """
    import fcntl
    import select
    import struct
    import termios

    from ipykernel.iostream import OutStream

    if not hasattr(OutStream, "_watch_pipe_fd"):
        return

    def _watch_pipe_fd(self: Any) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._kg_lock = threading.Lock()
        self._kg_taken = self._kg_passed = 0  # bytes read from the pipe, and written on
        try:
            while self._should_watch:
                select.select([self._fid], [], [])
                with self._kg_lock:  # `flush` counts the pipe and what we took at once
                    data = os.read(self._fid, 4096)
                    self._kg_taken += len(data)
                if not data or not self._should_watch:  # `close` wakes us with a byte
                    return
                try:
                    self.write(decoder.decode(data))
                    os.write(self._original_stdstream_copy, data)
                finally:
                    self._kg_passed += len(data)
        except Exception:
            self._exc = sys.exc_info()

    def _pending(fid: int) -> int:
        found: int = struct.unpack("i", fcntl.ioctl(fid, termios.FIONREAD, b"\0\0\0\0"))[0]
        return found

    original_flush: Callable[[Any], None] = OutStream.flush

    def flush(self: Any) -> None:
        watcher = getattr(self, "watch_fd_thread", None)
        lock = getattr(self, "_kg_lock", None)
        if (
            lock is not None
            and watcher is not None
            and watcher.is_alive()
            and watcher is not threading.current_thread()
        ):
            target = 0
            with contextlib.suppress(OSError), lock:
                target = self._kg_taken + _pending(self._fid)
            deadline = time.monotonic() + DRAIN_SECONDS
            while self._kg_passed < target and time.monotonic() < deadline:
                time.sleep(0.001)
        original_flush(self)

    OutStream._watch_pipe_fd = _watch_pipe_fd  # type: ignore[method-assign]
    OutStream.flush = flush  # type: ignore[method-assign]


DRAIN_SECONDS = 2.0
"""The longest a flush waits for the fd-level output written before it (only those bytes:
a program still writing in the background does not hold it)."""


class _BinaryStdout(io.BufferedIOBase):
    """`sys.stdout.buffer`: bytes written here reach the cell's output as UTF-8 text.

    Closing it (a `TextIOWrapper` around it being collected closes it) only flushes:
    the kernel's stream must outlive any wrapper code puts around it.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if isinstance(data, str):
            raise TypeError("a bytes-like object is required, not 'str'")
        chunk = bytes(memoryview(data))
        with self._lock:
            text = self._decoder.decode(chunk)
        if text:
            self._stream.write(text)
        return len(chunk)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self.flush()

    @property
    def closed(self) -> bool:
        return False


def _install_stdio_habits() -> None:
    """`sys.stdout.buffer.write(b"...")` and `sys.stdout.reconfigure(...)` work as in a terminal.

    ipykernel's OutStream is text only: both raise AttributeError there, and code that
    wraps the buffer (`io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8")`, common
    in code printing Chinese) dies on its first line. The output is text either way,
    always UTF-8, so reconfiguring changes nothing but is accepted.
    """
    from ipykernel.iostream import OutStream

    def buffer(self: Any) -> _BinaryStdout:
        binary: _BinaryStdout | None = self.__dict__.get("_kg_buffer")
        if binary is None:
            binary = self.__dict__["_kg_buffer"] = _BinaryStdout(self)
        return binary

    def reconfigure(self: Any, **options: Any) -> None:
        allowed = {"encoding", "errors", "newline", "line_buffering", "write_through"}
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(f"reconfigure() got an unexpected keyword argument {unknown.pop()!r}")
        self.flush()

    if not hasattr(OutStream, "buffer"):
        OutStream.buffer = property(buffer)  # type: ignore[attr-defined]
    if not hasattr(OutStream, "reconfigure"):
        OutStream.reconfigure = reconfigure  # type: ignore[attr-defined]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run a patch on a module right after it is first imported, however it is imported."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self._patches = patches

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = self._patches.pop(fullname, None)
        if patch is None:
            return None
        if not self._patches:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            try:
                patch(module)
            except Exception:  # a patch must never break the import itself
                pass

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def _install_chart_habits() -> None:
    """Figures reach the client as PNG whatever backend code picks; empty ones are not sent.

    Generated scripts often call `matplotlib.use("Agg")` (or pick TkAgg, Qt...) before
    `plt.show()`: with Agg nothing would be shown, and a GUI backend cannot start
    here. So any built-in backend chosen in the kernel becomes the inline one (which
    renders with Agg: savefig, `canvas.buffer_rgba()` and the rest behave the same).
    A figure without axes or any other artist (a bare `plt.figure()`) is not shown.

    Fonts in CHART_FALLBACK_FONTS (paths, `:`-separated; the image names its CJK font)
    back up whatever fonts code asks for, glyph by glyph: Chinese labels render even
    after `sns.set_theme()` or `plt.rcdefaults()` reset the font settings.
    """
    if os.environ.get("MPLBACKEND") != INLINE_BACKEND:
        return

    def patch_pyplot(pyplot: ModuleType) -> None:
        original = pyplot.switch_backend

        def switch_backend(newbackend: Any) -> None:
            if isinstance(newbackend, str) and not newbackend.lower().startswith("module://"):
                import matplotlib

                newbackend = INLINE_BACKEND
                # So that the inline backend, when first loaded now, hooks into IPython.
                matplotlib.rcParams["backend"] = INLINE_BACKEND
            original(newbackend)

        switch_backend.__doc__ = original.__doc__
        pyplot.switch_backend = switch_backend  # type: ignore[attr-defined]

    def patch_inline(backend: ModuleType) -> None:
        original = backend.display

        def display(*objs: Any, **kwargs: Any) -> Any:
            kept = [obj for obj in objs if not _is_empty_figure(obj)]
            if kept or not objs:
                return original(*kept, **kwargs)
            return None

        backend.display = display  # type: ignore[attr-defined]

    patches = {"matplotlib.pyplot": patch_pyplot, "matplotlib_inline.backend_inline": patch_inline}
    fallback = [p for p in os.environ.get("CHART_FALLBACK_FONTS", "").split(":") if p]
    if fallback:

        def patch_fonts(font_manager: ModuleType) -> None:
            original = font_manager.FontManager._find_fonts_by_props

            def find_fonts(self: Any, *args: Any, **kwargs: Any) -> list[str]:
                paths: list[str] = original(self, *args, **kwargs)
                return paths + [p for p in fallback if p not in paths]

            font_manager.FontManager._find_fonts_by_props = find_fonts

        patches["matplotlib.font_manager"] = patch_fonts
    if any(name in sys.modules for name in patches):
        return  # too late to hook the imports (never the case at kernel start)
    sys.meta_path.insert(0, _AfterImport(patches))


def _is_empty_figure(obj: Any) -> bool:
    figure = sys.modules.get("matplotlib.figure")
    if figure is None or not isinstance(obj, figure.Figure):
        return False
    # Its only child is then the background patch.
    return not obj.axes and len(obj.get_children()) <= 1


def _install_offline_pip(offline: bool) -> None:
    """In a kernel without network, `pip install` fails at once and says what to do.

    PIP_NO_INDEX makes pip look nowhere but at what is installed (so `pip install
    numpy` still answers "Requirement already satisfied"), and no retries or long
    timeouts apply to an explicit `--index-url`. `!pip install` and `%pip install`
    that fail are followed by a note on how packages are added.
    """
    if not offline:
        return
    os.environ.update({"PIP_NO_INDEX": "1", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"})
    from ipykernel.zmqshell import ZMQInteractiveShell

    original = ZMQInteractiveShell.system_piped

    def system(self: Any, cmd: str) -> Any:
        result = original(self, cmd)  # type: ignore[no-untyped-call]
        # Unset when the session was given a network policy (sessions/network.py).
        offline_now = os.environ.get("PIP_NO_INDEX") == "1"
        if offline_now and PIP_INSTALL.search(cmd) and self.user_ns.get("_exit_code"):
            print(PIP_HINT, file=sys.stderr, flush=True)
        return result

    ZMQInteractiveShell.system_piped = system  # type: ignore[method-assign]
    ZMQInteractiveShell.system = system


def main(argv: list[str]) -> None:
    settings = _settings(argv[argv.index("-f") + 1])
    _seed_font_cache()
    _install_tolerant_fd_capture()
    _install_thread_output_routing()
    _install_outcome_log()
    _install_lossless_iopub()
    _install_stdio_habits()
    _install_chart_habits()
    _install_offline_pip(bool(settings.get("offline")))
    from ipykernel.kernelapp import launch_new_instance

    # ipykernel reads its own arguments from `argv`; code sees only the program's name,
    # as a script run with no arguments does, so `argparse`'s `parse_args()` works.
    del sys.argv[1:]
    launch_new_instance(argv=argv, config=_config(settings))


if __name__ == "__main__":
    main(sys.argv[1:])

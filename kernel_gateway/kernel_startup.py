"""Runs inside the kernel's own Python, before ipykernel starts (both backends).

It must import nothing from kernel_gateway: in a container it is a lone file
copied next to the connection file. It works with ipykernel 6 and 7.

Thread output: ipykernel tags whatever a background thread prints with the
parent of the cell running *now*, so a thread started by one cell would print
into the next cell's stream. Here each thread remembers the cell that started
it and its output is published under that cell's parent; the gateway routes by
parent, so the output reaches the right execution, or nobody once it is done.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from typing import Any

FLUSH_CHARS = 64 * 1024


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
            buffer = getattr(self, "_buffer", None)
            # ipykernel sends what was written in each 0.2 s as one message, however
            # large: a tight print loop makes messages of tens of MB that the gateway
            # must decode whole. Flushing past FLUSH_CHARS bounds every message, and
            # the writer waits for the send, so output cannot outrun its consumer.
            if buffer is not None and buffer.tell() > FLUSH_CHARS and self._is_master_process():
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


def _config(connection_file: str) -> Any:
    """Kernel configuration from `startup.json`, written by the gateway beside the connection."""
    from traitlets.config import Config

    config = Config()
    path = os.path.join(os.path.dirname(connection_file), "startup.json")
    try:
        with open(path) as f:
            settings = json.load(f)
    except (OSError, ValueError):
        return config
    formats = settings.get("figure_formats")
    if formats:
        config.InlineBackend.figure_formats = set(formats)
    dpi = settings.get("figure_dpi")
    if dpi:
        config.InlineBackend.print_figure_kwargs = {"bbox_inches": "tight", "dpi": dpi}
    return config


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
    """Keep fd-level output flowing whatever bytes a program writes.

    ipykernel 6 decodes what it reads from the stdout/stderr pipes strictly: one
    invalid UTF-8 byte from a subprocess ends its watcher thread, and all later
    C-level and subprocess output of the kernel is silently lost. This version
    decodes incrementally (a character split across reads survives) and replaces
    invalid bytes.
    """
    import codecs

    from ipykernel.iostream import OutStream

    def _watch_pipe_fd(self: Any) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            data = os.read(self._fid, 4096)
            while data and self._should_watch:
                self.write(decoder.decode(data))
                os.write(self._original_stdstream_copy, data)
                data = os.read(self._fid, 4096)
        except Exception:
            self._exc = sys.exc_info()

    if hasattr(OutStream, "_watch_pipe_fd"):
        OutStream._watch_pipe_fd = _watch_pipe_fd  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    _seed_font_cache()
    _install_tolerant_fd_capture()
    _install_thread_output_routing()
    _install_outcome_log()
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance(argv=argv, config=_config(argv[argv.index("-f") + 1]))


if __name__ == "__main__":
    main(sys.argv[1:])

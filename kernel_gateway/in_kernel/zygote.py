"""The stateless fork server: runs inside a stateless kernel container, as root with a
handful of capabilities, and never runs user code itself. This is its entry point, the
container's command: `python /conn/zygote.py /conn/zygote.json`.

Like `kernel_startup.py` it imports nothing from kernel_gateway: the gateway copies it,
with the modules it imports (`in_kernel.PROGRAMS["zygote"]`), `startup.py` and
`zygote.json`, into the container's connection folder; Python puts that folder, the
script's own, first on `sys.path`, so they are imported from there.

Why: a stateless request used to pay for a new container, a Python start and the
preload (about 0.7 s of CPU). Here the preloaded interpreter and an IPython shell
are built once; each request is a `fork()` of that pristine process (copy-on-write,
a few milliseconds) that serves exactly one client as a small Jupyter kernel
(the same signed messages, with a key of its own, on one Unix stream instead of ZMQ
sockets), so the gateway drives it with the same protocol and code as any other kernel.

One idea a module:
- `allocator.py`: mimalloc in transparent huge pages, for which this process first runs
  itself again;
- `fork_server.py`: the preload, the light and full templates, the control protocol
  with the gateway, one fork per request;
- `fork_cleanup.py`: what separates two requests: a uid of its own for each, and
  everything it left killed and emptied before the next;
- `mini_kernel.py`: what a forked child runs: one request, as a small Jupyter kernel;
- `jupyter_wire.py`: Jupyter's signing and framing, the copy the gateway imports too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # in the gateway's package
    from . import allocator, fork_server
else:  # in a container's folder, beside this file
    import allocator
    import fork_server


def main(argv: list[str]) -> None:
    allocator.choose()
    with open(argv[0]) as f:
        config = json.load(f)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = fork_server.Zygote(config)
    zygote.prepare()
    zygote.serve()
    # Everything is ended and emptied; nothing is left to flush or free (and an
    # interpreter's finalization would walk the immortal objects for nothing).
    zygote.log.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

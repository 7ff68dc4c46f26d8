"""A kernel handed out by a pool, and everything its holder may ask of where it came from.

Both pools hand out a `Lease`: the warm pool (`WarmKernel`: a kernel of its own on
storage of its own) and the fork pool (`ForkedKernel`: one request's child of a
fork server, on that server's storage). Whoever holds a lease asks it, never the
kernel's type:

- `relaunchable`: whether a kernel that dies may be replaced by a new one on the
  same storage (a warm kernel's session revives; a forked request's cell ends
  `died`, and its fork server is emptied and given back instead);
- `files_owner`: the uid/gid files written into its workspace for the user belong
  to (a forked request runs under a uid of its own);
- `release()`: called once, after the holder closed its kernels (a session's
  close), to give back or remove what the lease holds. A session kept for a
  successor gateway is never released.
"""

from __future__ import annotations

from typing import Protocol

from kernel_gateway.kernels.backends.base import SessionStorage
from kernel_gateway.kernels.kernel import Kernel


class Lease(Protocol):
    @property
    def kernel(self) -> Kernel:
        """The kernel handed out (a relaunchable lease's replacements are the holder's)."""
        ...

    @property
    def storage(self) -> SessionStorage:
        """The storage the kernel runs on, and any replacement after it."""
        ...

    @property
    def relaunchable(self) -> bool:
        """Whether a kernel that died may be replaced by a new one on `storage`."""
        ...

    @property
    def files_owner(self) -> tuple[int, int] | None:
        """uid/gid for files written into the workspace; None: the gateway's own."""
        ...

    async def release(self) -> None:
        """Give back or remove what the lease holds, once its kernels are closed."""
        ...

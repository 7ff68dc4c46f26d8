"""Where a gateway keeps its connection files and session disks unless told otherwise."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT_RUNTIME_DIR = Path("/var/lib/kernel-gateway")


def default_runtime_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """Where a gateway keeps connection files and session disks unless told otherwise.

    - root: `/var/lib/kernel-gateway`, on disk. Session disks (sparse images) live
      here, and on a tmpfs such as `/run/user/0` they would be memory again; it is
      also a stable place for a later gateway to find what an earlier one left.
    - anyone else: `$XDG_RUNTIME_DIR/kernel-gateway` when that is an absolute path to
      a folder this user owns (`sudo` may keep the invoking user's), else
      `<tmp>/kernel-gateway-<uid>`. Without root, storage is plain folders anyway.

    Either way `RuntimeDir` checks the folder's owner and mode at startup.
    """
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return ROOT_RUNTIME_DIR
    xdg = (environ or {}).get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        try:
            info = os.stat(xdg)
        except OSError:
            pass
        else:
            if stat.S_ISDIR(info.st_mode) and info.st_uid == euid:
                return Path(xdg) / "kernel-gateway"
    return Path(tempfile.gettempdir()) / f"kernel-gateway-{euid}"

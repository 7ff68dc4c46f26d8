"""A kernel's container, as created: its connection folder, mounts, limits, runtime and
security options.

The connection folder (`<runtime>/<instance>/k/<id>/`, `/conn` inside) holds the
connection file and the in-kernel code, and the kernel's ipc sockets are made there: the
container needs no network and publishes no port. Every container has all capabilities
dropped (a fork server keeps the few it needs), no-new-privileges, a read-only root, memory
without swap, its CPU, pids and open files capped, and a bounded log. Its session's files,
/tmp and home are bound from the session's disk, or, where sessions have no disk of their
own, /tmp and home are tmpfs (memory).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.types

from kernel_gateway.kernels.backends.base import (
    ipc_connection,
    write_connection_file,
    write_in_kernel_program,
    write_startup_file,
)
from kernel_gateway.kernels.languages import Language
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import SessionStorage
from kernel_gateway.settings import Settings
from kernel_gateway.types import JSON, ConnectionInfo

CONTAINER_UID = 1000  # the image's `sandbox` user
FORK_SERVER_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]
"""What a fork server (root in its container, never running user code) keeps: enough to
give each request a uid of its own, and to kill and clean up after it."""
HOME_TMPFS_SIZE = "64m"  # home as a tmpfs, only when sessions have no disk of their own
SANDBOX_FOLDERS = ("/home/user", "/tmp", "/home/sandbox")
"""A kernel's writable folders as it sees them: its working directory, /tmp and home."""


def container_options(
    api: docker.APIClient,
    settings: Settings,
    *,
    conn_dir: Path,
    storage: SessionStorage,
    on_disk: bool,
    shared: bool,
    user: str,
    language: Language,
    fork_server: bool,
) -> dict[str, Any]:
    """`create_container`'s arguments (its name and labels aside) for a kernel of `language`
    working in `storage`, or for a fork server (`fork_server`).

    `on_disk`: the session has a disk of its own (files, /tmp and home on it, one cap);
    `shared`: its binds receive mounts made below them (see `DockerBackend.carry`).
    """
    s = settings
    disk = "rw,rslave" if shared else "rw"
    binds: dict[str, Mapping[str, str]] = {
        str(conn_dir): {"bind": "/conn", "mode": "rw"},
        str(storage.files): {"bind": SANDBOX_FOLDERS[0], "mode": disk},
    }
    tmpfs: dict[str, str] = {}
    uid = user.split(":")[0]
    owner = "uid=0,gid=0" if fork_server else f"uid={uid},gid={uid}"
    for mount in storage.mounts:  # volumes (kernels/volumes.py), where the session asked
        binds[str(mount.source)] = {"bind": mount.target, "mode": "rw"}
    if on_disk:  # one disk, one cap: files, /tmp and home
        binds[str(storage.tmp)] = {"bind": SANDBOX_FOLDERS[1], "mode": disk}
        binds[str(storage.home)] = {"bind": SANDBOX_FOLDERS[2], "mode": disk}
    else:  # no disk of its own: keep /tmp and home off the host's disk, as memory
        tmpfs = {
            "/tmp": f"rw,nosuid,nodev,size={s.workspace_size},mode=1777",
            "/home/sandbox": f"rw,nosuid,nodev,size={HOME_TMPFS_SIZE},mode=700,{owner}",
        }
    extra: dict[str, Any] = {}
    if not language.builtin:  # any kernelspec, behind the bridge (in_kernel/bridge.py)
        extra = {
            "command": [
                "/opt/venv/bin/python",
                "/conn/bridge.py",
                "/conn/kernel.json",
                str(language.kernelspec),
            ]
        }
    if fork_server:
        extra = {
            "user": "0:0",
            "command": ["/opt/venv/bin/python", "/conn/zygote.py", "/conn/zygote.json"],
        }
    host_config = api.create_host_config(
        binds=binds,
        network_mode=s.network,
        cap_drop=["ALL"],
        cap_add=FORK_SERVER_CAPABILITIES if fork_server else None,
        security_opt=["no-new-privileges:true"],
        # A fork server is init itself: it reaps every process (see zygote.py);
        # under gVisor, Docker's init beside it ended the container now and then.
        init=not fork_server,
        read_only=True,
        tmpfs=tmpfs,
        mem_limit=s.memory_limit_bytes,
        memswap_limit=s.memory_limit_bytes,
        nano_cpus=int(s.cpu_limit * 1e9),
        cpu_shares=s.fork_server_cpu_shares if fork_server else None,
        pids_limit=s.pids_limit,
        ulimits=[docker.types.Ulimit(name="nofile", soft=1024, hard=1024)],
        # ipykernel echoes fd-level output to the container's stdout: keep it bounded.
        log_config=docker.types.LogConfig(
            type="json-file", config={"max-size": "1m", "max-file": "1"}
        ),
    )
    if s.runtime:
        host_config["Runtime"] = s.runtime
    return {
        "image": language.image or s.image,
        **({"user": user} | extra),
        "host_config": host_config,
        "environment": {"HOME": "/home/sandbox"},
    }


def make_conn_dir(
    runtime: RuntimeDir,
    settings: Settings,
    language: Language,
    owner: tuple[int, int] | None,
) -> tuple[str, Path, ConnectionInfo]:
    """A kernel's connection folder with its files, owned by the kernel's user (`owner`;
    None: the gateway's)."""
    kernel_id, conn_dir = runtime.new_kernel_dir()
    try:
        info = ipc_connection(str(conn_dir / "k"))
        write_connection_file(conn_dir / "kernel.json", ipc_connection_inside(info))
        if language.builtin:
            offline = settings.network == "none"
            write_startup_file(conn_dir, settings, offline=offline)
        else:
            write_in_kernel_program(conn_dir, "bridge")  # bridge.py and jupyter_wire.py
        if owner is not None:
            for path in (conn_dir, *conn_dir.iterdir()):
                os.chown(path, *owner)
    except BaseException:
        shutil.rmtree(conn_dir, ignore_errors=True)
        raise
    return kernel_id, conn_dir, info


def make_fork_server_dir(runtime: RuntimeDir, settings: Settings, config: JSON) -> tuple[str, Path]:
    """A fork server's folder: zygote.py with the modules it imports, and its `config`."""
    kernel_id, conn_dir = runtime.new_kernel_dir()
    try:
        conn_dir.chmod(0o755)  # request uids traverse it to reach their own r<N>/
        write_in_kernel_program(conn_dir, "zygote")  # zygote.py and the modules it imports
        write_startup_file(conn_dir, settings, offline=settings.network == "none")
        (conn_dir / "zygote.json").write_text(json.dumps(config))
    except BaseException:
        shutil.rmtree(conn_dir, ignore_errors=True)
        raise
    return kernel_id, conn_dir


def ipc_connection_inside(info: ConnectionInfo) -> ConnectionInfo:
    """The same connection as the kernel sees it: the folder is mounted at /conn."""
    inside = info.copy()
    inside["ip"] = "/conn/" + Path(info["ip"]).name
    return inside


def read_connection(conn_dir: Path) -> ConnectionInfo | None:
    """A running kernel's connection as the gateway sees it, from the file the kernel reads."""
    try:
        inside = json.loads((conn_dir / "kernel.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(inside, dict) or not isinstance(inside.get("key"), str):
        return None
    info = ipc_connection(str(conn_dir / "k"), key=inside["key"])
    info["signature_scheme"] = str(inside.get("signature_scheme", info["signature_scheme"]))
    return info

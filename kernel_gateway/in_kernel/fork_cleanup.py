"""What separates two requests in one fork-server container (one runs at a time): the
places a request may write, handed to its uid before its child is forked, and everything
it left, killed and emptied after it (`fork_server.py` calls these).

- each child drops to a uid no earlier request had, with no capabilities, before it
  reads any request (`fork_server.Zygote._become`); it cannot signal, trace or read the
  fork server (root) and starts from the fork server's memory, which never held another
  request's code, output or key (the code arrives on the child's own socket);
- when a request ends, every process of its uid is killed (detached, double-forked,
  `setsid` ones included: the fork server is their subreaper), its SysV IPC objects
  are removed, and every place it could write (`/home/user`, `/tmp`, home,
  `/dev/shm`, `/dev/mqueue`, its socket folder) is emptied. Only then is the next
  child forked. Anything that cannot be verified clean is reported as `broken`
  and the gateway replaces the whole container.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from typing import Any

IPC_RMID = 0
IPC_PRIVATE = 0
KILL_SECONDS = 3.0


def hand_over(writable: list[str], uid: int) -> None:
    """Give the places a request may write to its `uid`, and to it alone."""
    for path in writable:
        _chown_tree(path, uid)
        os.chmod(path, 0o700)


def kill_uid(uid: int, libc: Any, mark: dict[str, int], reap: Callable[[], None]) -> None:
    """SIGKILL every process of `uid` until none is left (a process killed cannot
    fork again, so each round leaves at most what forked during the last one), then
    remove its SysV IPC objects. `reap` collects ended children (the fork server is the
    subreaper of them all); `mark` is the `ipc_mark` taken before the request."""
    deadline = time.monotonic() + KILL_SECONDS
    while time.monotonic() < deadline:
        alive = processes_of(uid)
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)  # a killed process takes a moment to exit
        reap()
    reap()
    if os.path.exists("/proc/sysvipc/shm"):
        made = _ipc_objects_of(uid)
    else:  # gVisor: no listing, but ids only grow; what came between two marks is its
        made = _ipc_between(mark, ipc_mark(libc))
    if made:
        _as(uid, lambda: _remove_ipc(libc, made))


def _as(uid: int, work: Callable[[], None]) -> None:
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


def wipe(writable: list[str], child_dir: str | None) -> None:
    """Empty what a request could write and give it back to root."""
    for path in writable:
        _empty(path)
        os.chown(path, 0, 0)
        os.chmod(path, 0o755)
    if os.path.isdir("/dev/mqueue"):
        _empty("/dev/mqueue")
    if child_dir:
        shutil.rmtree(child_dir, ignore_errors=True)


def oom_kills() -> int:
    """How many processes the container's out-of-memory killer has killed so far."""
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


def processes_of(uid: int) -> list[int]:
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


def ipc_mark(libc: Any) -> dict[str, int]:
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

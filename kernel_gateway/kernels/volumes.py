"""Volumes: named disks that outlive sessions, mounted by any number of them at once.

A volume is a folder of the gateway's, `<runtime>/volumes/<id>/` (0700), holding
`volume.json` (what it is) and its content under `data/`. Where the gateway can give
sessions disks of their own (root, loop devices: kernels/storage.py), `data/` is an ext4
image (`volume.img`) of the volume's size, loop-mounted: a write past the size gets
`ENOSPC` in every sandbox that mounts it, and the host's disk is safe. Unlike a session's
disk it has a journal: a volume outlives crashes. Elsewhere `data/` is a plain folder and
the size is not enforced (`Volumes.capped` is False; the startup log says so).

A session sees a volume only where it mounted it (a bind mount of `data/` into its
container, `SessionStorage.mounts`); the runtime folder is never visible to kernels.

The folder is read afresh on every call, so a successor and any gateway beside it on the
same runtime folder see the same volumes. A volume stays mounted on the host when the
gateway stops: the kernels a successor adopts keep their binds of it, and the successor
finds it mounted and never mounts the same image twice. It is unmounted when deleted.

The functions here block (mkfs, mount): `Volumes` runs them in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    GatewayError,
    TooManyVolumes,
    VolumeInUse,
    VolumeNotFound,
)
from kernel_gateway.kernels.storage import make_image, run_command, unmount
from kernel_gateway.tenants.principal import Principal

logger = logging.getLogger(__name__)

FORMAT = 1
ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_-]{0,62}\.)?vol-[0-9a-f]{20}$")
"""`vol-` and 20 hex digits, after `<node>.` in a cluster (`--node-name`)."""
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MKFS_OPTIONS = (
    "-q", "-F", "-t", "ext4", "-m", "0",
    "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
)  # fmt: skip
"""As a session's disk (kernels/storage.py), but with a journal: a volume outlives crashes."""
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,discard"
MIN_SIZE = 16 * 1024 * 1024
"""The smallest volume: ext4's own structures need a few MiB."""
SYSTEM_FOLDERS = (
    "/bin", "/boot", "/conn", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
    "/opt/venv", "/proc", "/root", "/run", "/sbin", "/sys", "/usr", "/var",
)  # fmt: skip
"""Where a volume may not be mounted: the system, the kernel's own programs and sockets."""


@dataclass(frozen=True)
class Volume:
    id: str
    name: str
    size: int
    """Its size cap in bytes (enforced where `Volumes.capped`)."""
    created_at: str
    owner: str | None = None
    """The id of the API key that made it (None: the admin); only it and the admin see it
    or mount it, and names are each owner's own."""

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "id": self.id, "name": self.name, "size": self.size,
                "created_at": self.created_at, "owner": self.owner}  # fmt: skip


@dataclass(frozen=True)
class VolumeMount:
    """A volume as one session mounts it: its data folder on the host, bound at `target`."""

    volume_id: str
    name: str
    source: Path
    target: str


def mount_target(path: str) -> str:
    """`path` as a place to mount a volume in a sandbox (normalized), or BadRequest."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise BadRequest(f"a volume's mount path must be an absolute path, not {path!r}")
    if len(path) > 1024:
        raise BadRequest("a volume's mount path is longer than 1024 characters")
    target = posixpath.normpath(path)
    if target.startswith("//"):
        target = "/" + target.lstrip("/")
    parts = [p for p in target.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise BadRequest(f"a volume cannot be mounted at {path!r}")
    for folder in SYSTEM_FOLDERS:
        if target == folder or target.startswith(folder + "/"):
            raise BadRequest(
                f"a volume cannot be mounted at {target!r}: {folder} is the sandbox's system "
                "(mount it under /mnt, /data or the home or working directory)"
            )
    if target in ("/tmp", "/workspace", "/home", "/home/sandbox", "/home/user", "/mnt", "/opt"):
        raise BadRequest(
            f"a volume cannot be mounted over {target} itself: mount it at a folder below it "
            f"({target.rstrip('/')}/data)"
        )
    return target


class Volumes:
    """The volumes of every gateway on one runtime folder."""

    def __init__(
        self,
        root: Path,
        *,
        capped: bool,
        owner: tuple[int, int] | None,
        max_volumes: int,
        node: str | None = None,
    ) -> None:
        self.root = root
        self._node = node
        """This gateway's node name in a cluster: new volumes' ids start with it."""
        self.capped = capped
        """Whether each volume is a disk of its own size (else a plain, uncapped folder)."""
        self._owner = owner
        self._max = max_volumes
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Mount every volume not mounted yet (a restart, a reboot). The folder is made with
        the first volume: a gateway that never made one leaves nothing behind."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        for volume in self._load():
            try:
                self._ensure_mounted(volume)
            except OSError as exc:
                logger.error("volume %s (%s) could not be mounted: %s", volume.name, volume.id, exc)

    # -- reading -----------------------------------------------------------------------------

    async def all(self, viewer: Principal) -> list[Volume]:
        """The volumes `viewer` sees, oldest first."""
        return [v for v in await asyncio.to_thread(self._load) if viewer.sees(v.owner)]

    async def get(self, ref: str, viewer: Principal) -> Volume:
        """A volume `viewer` sees, by id or name (its own name first, for the admin)."""
        return await asyncio.to_thread(self._get, ref, viewer)

    def _get(self, ref: str, viewer: Principal) -> Volume:
        if ID.match(ref):
            volume = self._read(self.root / ref)
            if volume is not None and viewer.sees(volume.owner):
                return volume
        named = [v for v in self._load() if v.name == ref and viewer.sees(v.owner)]
        for volume in sorted(named, key=lambda v: v.owner != viewer.owner):
            return volume
        raise VolumeNotFound(f"no volume with id or name {ref!r}")

    def _load(self) -> list[Volume]:
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        found = [self._read(self.root / e) for e in entries if ID.match(e)]
        return sorted((v for v in found if v is not None), key=lambda v: (v.created_at, v.id))

    @staticmethod
    def _read(folder: Path) -> Volume | None:
        try:
            data = json.loads((folder / "volume.json").read_text())
            owner = data.get("owner")
            return Volume(
                str(data["id"]),
                str(data["name"]),
                int(data["size"]),
                str(data["created_at"]),
                str(owner) if owner else None,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being made or removed, or not a volume

    async def mounts(self, asked: dict[str, str], viewer: Principal) -> tuple[VolumeMount, ...]:
        """A session's volumes ({name or id: mount path}, those `viewer` sees) as mounts;
        VolumeNotFound for one missing, BadRequest for a mount path not allowed or
        overlapping another."""
        mounts: list[VolumeMount] = []
        for ref, path in asked.items():
            volume = await self.get(ref, viewer)
            target = mount_target(path)
            for other in mounts:
                if other.volume_id == volume.id:
                    raise BadRequest(f"volume {volume.name!r} is asked for twice")
                if f"{target}/".startswith(f"{other.target}/") or f"{other.target}/".startswith(
                    f"{target}/"
                ):
                    raise BadRequest(f"mount paths {other.target!r} and {target!r} overlap")
            mounts.append(VolumeMount(volume.id, volume.name, self.data(volume), target))
        return tuple(mounts)

    def data(self, volume: Volume) -> Path:
        """The volume's content on the host (what sessions mount)."""
        return self.root / volume.id / "data"

    async def used_bytes(self, volume: Volume) -> int:
        def used() -> int:
            st = os.statvfs(self.data(volume))
            return (st.f_blocks - st.f_bfree) * st.f_frsize

        try:
            return await asyncio.to_thread(used)
        except OSError:
            return 0

    # -- changing ----------------------------------------------------------------------------

    async def create(self, name: str, size: int, owner: Principal) -> Volume:
        if not NAME.match(name):
            raise BadRequest(
                f"a volume's name is 1 to 128 letters, digits and -_. starting with a letter or "
                f"digit, not {name!r}"
            )
        size = max(size, MIN_SIZE)
        async with self._lock:
            volumes = await asyncio.to_thread(self._load)
            if any(v.name == name and v.owner == owner.owner for v in volumes):
                raise Conflict(f"a volume named {name!r} exists already")
            if len(volumes) >= self._max:
                raise TooManyVolumes(
                    f"the gateway keeps at most {self._max} volumes (--max-volumes); delete one"
                )
            volume = Volume(
                (f"{self._node}." if self._node else "") + "vol-" + secrets.token_hex(10),
                name,
                size,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                owner.owner,
            )
            try:
                await asyncio.shield(asyncio.to_thread(self._make, volume))
            except (OSError, subprocess.SubprocessError) as exc:
                raise GatewayError(f"could not make the volume's disk: {exc}") from exc
            return volume

    def _make(self, volume: Volume) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = self.root / volume.id
        folder.mkdir(mode=0o700)
        try:
            (folder / "data").mkdir(mode=0o755)
            if self.capped:
                make_image(folder / "volume.img", volume.size, MKFS_OPTIONS)
                self._ensure_mounted(volume)
            if self._owner is not None:
                os.chown(folder / "data", *self._owner)
            (folder / "data").chmod(0o755)
            temporary = folder / "volume.json.new"
            temporary.write_text(json.dumps(volume.to_json()))
            temporary.rename(folder / "volume.json")  # it exists once complete
        except BaseException:
            self._remove(folder)
            raise

    def _ensure_mounted(self, volume: Volume) -> None:
        folder = self.root / volume.id
        image = folder / "volume.img"
        if not image.exists() or os.path.ismount(folder / "data"):
            return
        run_command("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(folder / "data"))
        lost = folder / "data" / "lost+found"
        with contextlib.suppress(OSError):
            shutil.rmtree(lost)  # mkfs's own folder: not the user's

    async def delete(self, ref: str, mounted_by: list[str], viewer: Principal) -> Volume:
        """Delete a volume and its content. `mounted_by`: sessions that mount it (refused)."""
        async with self._lock:
            volume = await self.get(ref, viewer)
            if mounted_by:
                raise VolumeInUse(
                    f"volume {volume.name!r} is mounted by session(s) {', '.join(mounted_by)}: "
                    "delete them first"
                )
            await asyncio.shield(asyncio.to_thread(self._remove, self.root / volume.id))
            return volume

    @staticmethod
    def _remove(folder: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            (folder / "volume.json").unlink()  # no longer listed, whatever follows
        data = folder / "data"
        if os.path.ismount(data):
            unmount(data)
        shutil.rmtree(folder, ignore_errors=True)

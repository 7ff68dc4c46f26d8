"""envd's folder watching, by scans of the workspace.

The gateway does not run inside the sandbox, so it has no inotify on what the code does
there: a watcher compares scans of the folder (at each `GetWatcherEvents`, or every
`POLL_SECONDS` for a `WatchDir` stream) and says what changed between two, in envd's
terms and order:

- a new folder: `CREATE`; a new file: `CREATE`, `CHMOD` (its owner set) and, if it holds
  anything, `WRITE`, as envd's own upload makes one;
- a file whose size, time or inode changed: `WRITE`; whose mode or owner changed: `CHMOD`;
- a name gone whose inode shows up under a new name: `RENAME` (the old name), then
  `CREATE` (the new), as inotify reports a move; any other name gone: `REMOVE`.

What happened between two scans and was undone (a file made and removed) is not seen.
With `include_entry`, each event of a path that still exists carries its `EntryInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel_gateway.kernels.workspace import Entry, Workspace
from kernel_gateway.protocols.e2b.envd_entries import described

POLL_SECONDS = 0.5
MAX_DEPTH = 32

Scan = dict[str, Entry]
"""Each name under the watched folder (relative to it) and what was there."""


@dataclass
class Watch:
    """One watcher: a folder, how deep, and its last scan."""

    rel: str
    recursive: bool
    include_entry: bool
    last: Scan

    @classmethod
    def start(
        cls, workspace: Workspace, rel: str, *, recursive: bool, include_entry: bool
    ) -> Watch:
        """Scans the folder now (runs in a thread)."""
        return cls(rel, recursive, include_entry, scan(workspace, rel, recursive))

    def changes(self, workspace: Workspace) -> list[dict[str, Any]]:
        """What changed since the last call, as `FilesystemEvent`s (runs in a thread)."""
        now = scan(workspace, self.rel, self.recursive)
        found = events(self.last, now)
        self.last = now
        out = []
        for name, kind in found:
            event: dict[str, Any] = {"name": name, "type": f"EVENT_TYPE_{kind}"}
            entry = now.get(name)
            if self.include_entry and entry is not None and kind != "REMOVE":
                event["entry"] = described(workspace, entry)
            out.append(event)
        return out


def scan(workspace: Workspace, rel: str, recursive: bool) -> Scan:
    prefix = f"{rel}/" if rel else ""
    entries = workspace.list_dir(rel, MAX_DEPTH if recursive else 1)
    return {e.path[len(prefix) :]: e for e in entries if not _temporary(e.path)}


def _temporary(path: str) -> bool:
    """An upload still being written (`Workspace.begin_upload`): not the user's yet."""
    return path.rsplit("/", 1)[-1].startswith(".upload-")


def events(before: Scan, now: Scan) -> list[tuple[str, str]]:
    """(name, envd event type) for each change from `before` to `now`, in envd's order."""
    out: list[tuple[str, str]] = []
    gone = sorted(before.keys() - now.keys())
    moved_from = {before[name].inode: name for name in gone if before[name].inode}
    renamed: set[str] = set()
    for name in sorted(now.keys() - before.keys()):
        entry = now[name]
        old = moved_from.pop(entry.inode, None) if entry.inode else None
        if old is not None and before[old].kind == entry.kind:
            renamed.add(old)
            out += [(old, "RENAME"), (name, "CREATE")]
            continue
        out.append((name, "CREATE"))
        if entry.kind == "file":
            out.append((name, "CHMOD"))
            if entry.size:
                out.append((name, "WRITE"))
    for name in sorted(before.keys() & now.keys()):
        was, entry = before[name], now[name]
        if entry.kind == "file" and (
            (was.size, was.modified, was.inode) != (entry.size, entry.modified, entry.inode)
        ):
            out.append((name, "WRITE"))
        if (was.mode, was.uid, was.gid) != (entry.mode, entry.uid, entry.gid):
            out.append((name, "CHMOD"))
    out += [(name, "REMOVE") for name in gone if name not in renamed]
    return out

"""Inside a Python kernel: its user namespace saved to a file, and loaded into a new kernel.

The gateway sends this module's source as silent code, with one call at its end
(`kernels/hibernation.py` on the gateway's side), so nothing of it is in the kernel before or
after. It only uses what the kernel image has (IPython, cloudpickle).

What is saved: every name the user made (variables, functions and classes defined in cells,
instances, closures: cloudpickle pickles `__main__`'s by value; modules by name, so they are
imported again; `_`, `__`, `___`), `In`/`Out` and the execution count, the working directory,
`sys.path` and environment variables. The kernel's settings come first, in a pickle of plain
values, so they are back before the names are loaded; then every name in one pickle, so
objects shared between names stay shared. A name whose value cannot be pickled (an open
socket, a generator, a thread, a C extension's object that refuses) is left out, and reported
with why; an `Out` entry too.

Saving is bounded in time (`seconds`): a value whose pickling never ends (a `__reduce__`
that loops) must not keep the kernel from its next cell. Past the limit the whole save
stops; each name is then tried alone within the same limit, to name the one at fault, and
`SaveTooLong` says which. Nothing is changed in the namespace; the file is the gateway's to
remove. The limit is a `SIGALRM` timer, so it stops Python code, not a C call that never
returns (the gateway interrupts the kernel then).

The report is a JSON string, read back by the gateway from the call's result.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

# Names IPython makes and keeps by itself (`In`/`Out` are restored through its history).
_IPYTHON_NAMES = frozenset({"In", "Out", "_ih", "_oh", "_dh", "exit", "quit"})
# Variables each kernel has of its own: never carried from the old kernel to the new one.
_KERNEL_OWN = frozenset({"HOME", "PWD", "OLDPWD", "HOSTNAME", "KERNEL_ID", "SHLVL", "_"})
_FORMAT = 2


class SaveTooLong(Exception):
    """Saving did not finish within its time limit (the words name the value at fault)."""


class _Late(BaseException):
    """The timer rang (a BaseException: no `except Exception` in a `__reduce__` keeps it)."""


@contextlib.contextmanager
def _limit(seconds: float) -> Iterator[None]:
    """Raise `_Late` in this thread once `seconds` have passed (0: no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise _Late

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _too_long(names: dict[str, Any], dump: Any, seconds: float) -> SaveTooLong:
    """Which of `names` alone takes more than `seconds` to pickle: the error naming it."""
    for name, value in names.items():
        try:
            with _limit(seconds):
                dump(value, _Sink())
        except _Late:
            return SaveTooLong(f"saving {name!r} did not finish within {seconds:g} s")
        except BaseException:  # noqa: BLE001, S112 - not picklable: the save's other path
            continue
    return SaveTooLong(f"saving the session did not finish within {seconds:g} s")


class _Sink:
    """A file that keeps nothing: pickling a value only to learn whether it can be."""

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes  # bytes, or a protocol-5 PickleBuffer


def _user_names(shell: Any) -> list[str]:
    hidden = shell.user_ns_hidden
    names = []
    for name, value in shell.user_ns.items():
        if name in _IPYTHON_NAMES or (len(name) > 4 and name[:2] == name[-2:] == "__"):
            continue
        if name in hidden and hidden[name] is value:
            continue  # put there by IPython or the gateway's start-up, not by a cell
        names.append(name)
    return names


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = text[0] if text else ""
    return f"{type(exc).__name__}: {detail}"[:300] if detail else type(exc).__name__


def _picklable(value: Any, dumps: Any) -> str | None:
    """None if `value` pickles; else why not."""
    import io

    try:
        dumps(value, _Sink())
    except _Late:
        raise  # the save's time is up: not this value's fault alone
    except RecursionError:
        return "RecursionError: too deeply nested to save"
    except BaseException as exc:  # noqa: BLE001 - any failure means "not kept", with why
        if isinstance(value, io.IOBase) and not isinstance(value, (io.BytesIO, io.StringIO)):
            state = "a closed file" if value.closed else "an open file"
            return f"{state}: open it again by name (what it wrote is on disk)"
        return _why(exc)
    return None


def save(path: str, seconds: float = 0.0) -> str:
    """Write the user's namespace to `path`; return the report as JSON. `SaveTooLong` when
    the pickling takes more than `seconds` (0: no limit).

    Two pickles, one after the other: first the kernel's settings (working directory,
    `sys.path`, environment, history), made of plain values, so that `restore` puts them back
    before it loads anything that may need them (a module imported from a folder the user
    added to `sys.path`); then every name and `Out` in one, so shared objects stay shared."""
    import cloudpickle  # type: ignore[import-untyped,import-not-found,unused-ignore]

    shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821 - an IPython global
    history = shell.history_manager

    def dump(value: Any, file: Any) -> None:
        cloudpickle.dump(value, file, protocol=pickle.HIGHEST_PROTOCOL)

    settings = {
        "format": _FORMAT,
        "in": [str(x) for x in history.input_hist_parsed],
        "in_raw": [str(x) for x in history.input_hist_raw],
        "execution_count": int(shell.execution_count),
        "cwd": os.getcwd(),
        "sys_path": [str(x) for x in sys.path],
        "environ": dict(os.environ),
    }
    namespace = {name: shell.user_ns[name] for name in _user_names(shell)}
    out = dict(shell.user_ns.get("Out", {}))
    payload = {"names": namespace, "out": out}
    lost: list[dict[str, str]] = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o600), "wb") as file:
        pickle.dump(settings, file, protocol=pickle.HIGHEST_PROTOCOL)
        start = file.tell()
        try:
            with _limit(seconds):
                try:
                    dump(payload, file)
                except _Late:
                    raise
                except BaseException:  # noqa: BLE001 - find the names at fault, leave them out
                    for name in list(namespace):
                        reason = _picklable(namespace[name], dump)
                        if reason is not None:
                            del namespace[name]
                            lost.append({"name": name, "reason": reason})
                    for key in list(out):
                        reason = _picklable(out[key], dump)
                        if reason is not None:
                            del out[key]
                            lost.append({"name": f"Out[{key}]", "reason": reason})
                    file.seek(start)
                    file.truncate()
                    dump(payload, file)
        except _Late:
            named = {**namespace, **{f"Out[{k}]": v for k, v in out.items()}}
            raise _too_long(named, dump, seconds) from None
        size = file.tell()
    return json.dumps({"saved": len(namespace), "lost": lost, "bytes": size})


def restore(path: str, devices: dict[str, int]) -> str:
    """Load what `save` wrote at `path` into this (fresh) kernel; return the report as JSON.

    `devices`: the device each storage folder must be on, as the gateway sees it: a kernel
    that sees other storage (a runtime where the gateway's mounts do not reach it) refuses to
    load, so no session ever runs on another's files.
    """
    import importlib
    import site

    for folder, device in devices.items():
        if os.stat(folder).st_dev != device:
            raise RuntimeError(f"{folder} is not this session's storage")
    shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821 - an IPython global
    with open(path, "rb") as file:
        settings = pickle.load(file)
        if not isinstance(settings, dict) or settings.get("format") != _FORMAT:
            raise RuntimeError("not a snapshot of this gateway's format")
        # The kernel's settings first: what loading the names may need.
        try:
            os.chdir(settings["cwd"])
        except OSError:
            os.chdir(os.getcwd())  # the folder mounted over the one the kernel started in
        saved_path = settings["sys_path"]
        sys.path[:] = saved_path + [p for p in sys.path if p not in saved_path]
        user_site = site.getusersitepackages()
        if os.path.isdir(user_site) and user_site not in sys.path:
            site.addsitedir(user_site)  # packages the user installed, found again
        importlib.invalidate_caches()
        environ = settings["environ"]
        for name in [n for n in os.environ if n not in environ and n not in _KERNEL_OWN]:
            del os.environ[name]
        for name, value in environ.items():
            if name not in _KERNEL_OWN:
                os.environ[name] = value
        payload = pickle.load(file)
    shell.user_ns.update(payload["names"])
    history = shell.history_manager
    history.input_hist_parsed[:] = settings["in"]
    history.input_hist_raw[:] = settings["in_raw"]
    history.output_hist.clear()
    history.output_hist.update(payload["out"])
    shell.execution_count = settings["execution_count"]
    return json.dumps({"restored": len(payload["names"])})

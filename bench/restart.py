"""How long a gateway with persisted sessions takes to serve again after a restart.

    python bench/restart.py                    # 50 sessions, SIGTERM then SIGKILL
    python bench/restart.py --sessions 50 --rounds 3 --json bench/results/restart.json

Starts `kernel-gateway serve --persist-sessions` (docker backend) on a fresh runtime
dir, creates N sessions that each hold a variable, then for each way of stopping
(SIGTERM with its drain, SIGKILL): stops it, starts the next process and measures

- `serving`: from the new process's start until `GET /health` answers (the gateway
  adopts every session before it answers, so this is when all are usable);
- `first_cell`: from the start until a cell on an adopted session has printed its
  variable back, checked for every session afterwards;
- `stop`: how long the old process took to exit (SIGTERM drains; nothing runs here).

The goal (issue: durable sessions): `serving` within 2 s with 50 sessions. Reported,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from kernel_gateway.settings import DEFAULT_IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(self, runtime: Path, image: str, sessions: int) -> None:
        self.runtime = runtime
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.image = image
        self.sessions = sessions
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, persist: bool = True) -> float:
        """Start; return seconds until /health answers."""
        cmd = [
            sys.executable,
            "-m",
            "kernel_gateway",
            "serve",
            "--backend",
            "docker",
            "--image",
            self.image,
            "--port",
            str(self.port),
            "--runtime-dir",
            str(self.runtime),
            "--max-sessions",
            str(self.sessions + 8),
            "--pool-size",
            "2",
            "--log-level",
            "info",
            *(["--persist-sessions"] if persist else []),
        ]
        env = {**os.environ, "KG_PRELOAD": "", "KG_KERNEL_START_TIMEOUT": "120"}
        started = time.monotonic()
        self.log = self.runtime.parent / f"gateway-{time.time():.0f}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                raise SystemExit("the gateway exited while starting")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            if time.monotonic() - started > 120:
                raise SystemExit("the gateway did not come up")
            time.sleep(0.005)

    def stop(self, sig: int) -> float:
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(120)
        return time.monotonic() - started


def cell(url: str, sid: str, code: str) -> str:
    response = httpx.post(
        f"{url}/sessions/{sid}/execute",
        json={"code": code},
        headers={"Accept": "application/json"},
        timeout=120,
    )
    response.raise_for_status()
    return str(response.json()["stdout"])


def one_round(gw: Gateway, sids: list[str], how: str) -> dict[str, float]:
    stop = gw.stop(getattr(signal, how))
    started = time.monotonic()
    serving = gw.start()
    assert cell(gw.url, sids[0], "print(v)") == f"{sids[0]}\n"
    first_cell = time.monotonic() - started
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda s: cell(gw.url, s, "print(v)"), sids))
    lost = sum(1 for sid, out in zip(sids, outs, strict=True) if out != f"{sid}\n")
    return {"stop": stop, "serving": serving, "first_cell": first_cell, "lost": lost}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per way of stopping")
    parser.add_argument("--image", default=os.environ.get("KG_IMAGE", DEFAULT_IMAGE))
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-restart-", dir="/var/tmp"))
    gw = Gateway(runtime / "rt", args.image, args.sessions)
    print(f"starting a gateway; creating {args.sessions} sessions ...", flush=True)
    gw.start()
    sids = []
    for _ in range(args.sessions):
        response = httpx.post(gw.url + "/sessions", timeout=120)
        response.raise_for_status()
        sids.append(response.json()["id"])
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: cell(gw.url, s, f"v = {s!r}"), sids))
    print(f"logs in {runtime}", flush=True)
    results: dict[str, Any] = {}
    try:
        for how in ("SIGTERM", "SIGKILL"):
            rounds = [one_round(gw, sids, how) for _ in range(args.rounds)]
            results[how] = {
                key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]
            }
            results[how]["rounds"] = rounds
            figures = results[how]
            print(
                f"{how}: serving again {figures['serving']:.2f} s after the new process "
                f"started; first cell on an adopted session {figures['first_cell']:.2f} s; "
                f"old process exited in {figures['stop']:.2f} s; lost {figures['lost']:.0f} "
                f"of {args.sessions}",
                flush=True,
            )
    finally:
        gw.stop(signal.SIGTERM)
        gw.start(persist=False)  # adopts, then removes everything at its stop
        gw.stop(signal.SIGTERM)
        subprocess.run(["rm", "-rf", str(runtime / "rt")], check=False)
    results["sessions"] = args.sessions
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

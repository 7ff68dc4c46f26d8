"""Snapshots and forks: how long a fork of a session takes to be ready, and a session from a
snapshot; for a small session and for one holding a 100 MB pandas DataFrame, on the docker
backend.

    python -m bench.snapshots              # 20 of each
    python -m bench.snapshots --smoke      # a tiny run, to check the bench works

- **snapshot**: `POST /sessions/{id}/snapshots` until it answers (its variables and files
  written and kept; the session runs on).
- **from a snapshot**: `POST /sessions {"snapshot": id}` until it answers (a warm kernel, the
  files unpacked in it, the variables loaded), then **first result**: `1 + 1` in it until its
  `done`: the two together are what a client waits for a session from a snapshot.
- **fork**: `POST /sessions/{id}/fork {"count": 1}` until it answers (a snapshot for the
  moment, a session from it, the snapshot dropped): the copy is ready when it answers.
  `fork ×4`: four copies in one call.

The bench waits for the warm pool before each measure (a session from a snapshot takes a
warm kernel when one is ready). Targets (issue 37): a fork ready in under 1 s, a session
from a snapshot under 1 s, for the 100 MB session. Asserts nothing; prints a table and
writes bench/results/snapshots.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.hibernation import BIG, SMALL
from bench.run import ROOT, free_port, machine, report, serving, summary, wait_warm
from kernel_gateway.settings import DEFAULT_IMAGE

POOL = 4
JSON_ACCEPT = {"Accept": "application/json"}


def measure(http: httpx.Client, url: str, code: str, n: int) -> dict[str, Any]:
    sid = _session(http, code)
    snapshot: list[float] = []
    restore: list[float] = []
    first: list[float] = []
    fork: list[float] = []
    fork4: list[float] = []
    size = 0
    try:
        for _ in range(n):
            wait_warm(url, POOL)
            t = time.perf_counter()
            taken = _ok(http.post(f"/sessions/{sid}/snapshots", json={}), 201)
            snapshot.append(time.perf_counter() - t)
            size = taken["bytes"]
            wait_warm(url, POOL)
            t = time.perf_counter()
            made = _ok(http.post("/sessions", json={"snapshot": taken["id"]}), 201)
            restore.append(time.perf_counter() - t)
            t = time.perf_counter()
            _ok(
                http.post(
                    f"/sessions/{made['id']}/execute", json={"code": "1 + 1"}, headers=JSON_ACCEPT
                ),
                200,
            )
            first.append(time.perf_counter() - t)
            http.delete(f"/sessions/{made['id']}")
            http.delete(f"/snapshots/{taken['id']}")
            for count, times in ((1, fork), (4, fork4)):
                wait_warm(url, POOL)
                t = time.perf_counter()
                forks = _ok(http.post(f"/sessions/{sid}/fork", json={"count": count}), 201)
                times.append(time.perf_counter() - t)
                for made_fork in forks["forks"]:
                    if "session" not in made_fork:
                        raise RuntimeError(f"a fork failed: {made_fork}")
                    http.delete(f"/sessions/{made_fork['session']['id']}")
    finally:
        http.delete(f"/sessions/{sid}")
    return {
        "snapshot_bytes": size,
        "snapshot": summary(snapshot),
        "from_snapshot": summary(restore),
        "first_result": summary(first),
        "from_snapshot_to_first_result": summary(
            [a + b for a, b in zip(restore, first, strict=True)]
        ),
        "fork": summary(fork),
        "fork_4": summary(fork4),
    }


def _session(http: httpx.Client, code: str) -> str:
    sid = str(_ok(http.post("/sessions"), 201)["id"])
    done = _ok(http.post(f"/sessions/{sid}/execute", json={"code": code}, headers=JSON_ACCEPT), 200)
    if done["status"] != "ok":
        raise RuntimeError(f"setting up the session failed: {done}")
    return sid


def _ok(response: httpx.Response, status: int) -> dict[str, Any]:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text}")
    document: dict[str, Any] = response.json()
    return document


def tables(results: dict[str, Any]) -> list[str]:
    rows = [
        "| session | snapshot | take p50 (p90) | session from it p50 (p90) | … to first "
        "`1 + 1` p50 (p90) | fork p50 (p90) | fork ×4 p50 (p90) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in (("small", "small"), ("dataframe", "100 MB DataFrame")):
        r = results[key]

        def cell(name: str, r: dict[str, Any] = r) -> str:
            return f"{r[name]['p50_ms']:.0f} ms ({r[name]['p90_ms']:.0f})"

        rows.append(
            f"| {label} | {r['snapshot_bytes'] / 1e6:.2f} MB | {cell('snapshot')} | "
            f"{cell('from_snapshot')} | {cell('from_snapshot_to_first_result')} | "
            f"{cell('fork')} | {cell('fork_4')} |"
        )
    return ["\n".join(rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--n", type=int, default=20, help="measures of each")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the kernel image")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "snapshots.json")
    args = parser.parse_args()
    n = 1 if args.smoke else args.n
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-snapshots-"))
    port = free_port()
    cmd = [
        sys.executable, "-m", "kernel_gateway", "serve",
        "--backend", "docker", "--port", str(port), "--image", args.image,
        "--pool-size", str(POOL), "--max-sessions", "16", "--stateless-mode", "container",
        "--runtime-dir", str(runtime), "--log-level", "warning",
    ]  # fmt: skip
    try:
        with serving(cmd, port, POOL, up_within=90) as url:
            with httpx.Client(base_url=url, timeout=600) as http:
                print("small session…", flush=True)
                results["small"] = measure(http, url, SMALL, n)
                print("100 MB DataFrame…", flush=True)
                results["dataframe"] = measure(http, url, BIG, n)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    report(results, tables(results), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two source trees of the gateway side by side, in one run, on one kernel image.

    python bench/ab.py --base main~3            # a git revision against the working tree
    python bench/ab.py --base v0.1.0 --seconds 20 --iterations 400

Figures from different days or machines do not compare; this measures a change the
only way that does. It checks the base revision out into a temporary git worktree,
starts one gateway from each tree (`python -m kernel_gateway serve`, docker backend,
the same image and flags), and interleaves every workload between them in short
rounds so that drift on the machine hits both alike:

- warm `1+1` round trip on a session (the lean keep-alive SSE client of `run.py`);
- stateless `print(1)` throughput (`POST /execute`, JSON answer) at concurrency 1 and 8.

Asserts nothing; prints a table and writes `bench/results/ab.json`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.run import (
    ROOT,
    LeanSSE,
    free_port,
    machine,
    serving,
    stateless_throughput,
    summary,
    timed,
    wait_warm,
)
from kernel_gateway.settings import DEFAULT_IMAGE

REPO = ROOT.parent
POOL = 4


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kg-ab-")) / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(path), rev], cwd=REPO, check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, check=False)
        shutil.rmtree(path.parent, ignore_errors=True)


@contextmanager
def gateway(tree: Path, image: str, runtime: Path, fork_servers: int) -> Iterator[str]:
    """`kernel-gateway serve` from the sources in `tree`, warm pool filled."""
    port = free_port()
    cmd = [sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker"]
    cmd += ["--port", str(port), "--pool-size", str(POOL), "--max-stateless", "16"]
    cmd += ["--fork-servers", str(fork_servers), "--image", image]
    cmd += ["--runtime-dir", str(runtime), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with serving(cmd, port, POOL, up_within=90, env=env, cwd=tree) as url:
        yield url


def round_trips(urls: dict[str, str], n: int) -> dict[str, Any]:
    """Warm `1+1` on a session of each gateway, in alternating batches."""
    sessions = {name: httpx.post(url + "/sessions").json()["id"] for name, url in urls.items()}
    for url in urls.values():
        wait_warm(url, POOL)
    calls = {name: (LeanSSE(url), sessions[name]) for name, url in urls.items()}
    samples: dict[str, list[float]] = {name: [] for name in urls}

    def once(name: str) -> None:
        lean, sid = calls[name]
        lean.execute(sid, "1+1")

    try:
        for name in calls:
            timed(functools.partial(once, name), 20, warmup=0)
        batch = max(5, n // 20)
        for _ in range(max(1, n // batch)):
            for name in calls:
                samples[name] += timed(functools.partial(once, name), batch, warmup=1)
    finally:
        for lean, _ in calls.values():
            lean.close()
        for name, url in urls.items():
            httpx.delete(f"{url}/sessions/{sessions[name]}")
    return {name: summary(values) for name, values in samples.items()}


def throughput(urls: dict[str, str], seconds: float, concurrency: int, rounds: int) -> Any:
    """Stateless `print(1)` for `seconds` per gateway, split into alternating rounds."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            runs[name].append(stateless_throughput(url, seconds / rounds, concurrency))
    out: dict[str, Any] = {}
    for name, parts in runs.items():
        completed = sum(p["completed"] for p in parts)
        elapsed = sum(p["seconds"] for p in parts)
        out[name] = {
            "requests_per_s": round(completed / elapsed, 2),
            "completed": completed,
            "failed": sum(p["failed"] for p in parts),
            "refused_429_503": sum(p["refused_429_503"] for p in parts),
            "p50_ms_by_round": [p["latency"]["p50_ms"] for p in parts],
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--image", default=os.environ.get("KG_IMAGE", DEFAULT_IMAGE))
    parser.add_argument("--iterations", type=int, default=400, help="warm 1+1 per tree")
    parser.add_argument("--seconds", type=float, default=20, help="stateless load per tree")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--fork-servers", type=int, default=4)
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "ab.json")
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.base],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    names = {"base": f"base {rev}", "tree": f"working tree (HEAD {head})"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-ab-rt-"))
    results: dict[str, Any] = {"machine": machine(), "image": args.image, "trees": names}
    try:
        with worktree(args.base) as base_tree:
            with (
                gateway(base_tree, args.image, runtime / "base", args.fork_servers) as base_url,
                gateway(REPO, args.image, runtime / "tree", args.fork_servers) as tree_url,
            ):
                urls = {"base": base_url, "tree": tree_url}
                print("warm 1+1 round trips, interleaved…", flush=True)
                results["warm_round_trip"] = round_trips(urls, args.iterations)
                for concurrency in (1, 8):
                    print(f"stateless print(1) at concurrency {concurrency}…", flush=True)
                    results[f"stateless_c{concurrency}"] = throughput(
                        urls, args.seconds, concurrency, args.rounds
                    )
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    print()
    print(f"| figure | {names['base']} | {names['tree']} |")
    print("|---|---|---|")
    for stat in ("p50_ms", "p99_ms"):
        row = [results["warm_round_trip"][n][stat] for n in names]
        print(f"| warm `1+1` round trip, {stat[:-3]} (ms) | {row[0]} | {row[1]} |")
    for concurrency in (1, 8):
        block = results[f"stateless_c{concurrency}"]
        row = [block[n]["requests_per_s"] for n in names]
        print(f"| stateless `print(1)`, concurrency {concurrency} (req/s) | {row[0]} | {row[1]} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

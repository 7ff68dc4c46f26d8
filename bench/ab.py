"""A baseline and the current tree side by side, in one run: a git revision or an image.

    python -m bench.ab --base main~3                  # a git revision against the working tree
    python -m bench.ab --base kernel-gateway-kernel:old   # an image tag against --image
    python bench/run.py --compare REF                 # the same, from the main bench
    python -m bench.ab --base REF --smoke             # tiny run, to check the bench works

Figures from different days or machines do not compare; this measures a change the
only way that does. REF is an image when Docker has an image of that name, else a git
revision: that revision is checked out into a temporary git worktree and one gateway
runs from each tree on `--image`; for an image, two gateways run from the working tree,
one on each image. Both get the same flags (the gateway's defaults, docker backend).
Every workload alternates between the two in short rounds, so drift on the machine hits
both alike:

- warm `1+1` round trip on a session (the lean keep-alive SSE client of `run.py`);
- `POST /execute` of `print(1)`, one at a time;
- stateless `print(1)` throughput (`POST /execute`, JSON answer) at concurrency 1 and 8;
- the first chart in a fresh session;
- for two images also what only the image decides: `1+1` through plain jupyter_client to a
  kernel container (no gateway), and a cold start (container created -> kernel answers).

Asserts nothing; prints a table with the ratio current/baseline (below 1 is faster for
times, above 1 is more for rates) and writes `bench/results/ab.json`.
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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx

from bench.run import (
    ROOT,
    LeanSSE,
    RawKernel,
    cold_start_samples,
    first_chart_samples,
    free_port,
    machine,
    serving,
    stateless_sequential_samples,
    stateless_throughput,
    summary,
    timed,
    wait_warm,
)
from kernel_gateway.settings import DEFAULT_IMAGE

REPO = ROOT.parent
POOL = 4
SIDES = ("base", "tree")


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
def gateway(tree: Path, image: str, runtime: Path) -> Iterator[str]:
    """`kernel-gateway serve` from the sources in `tree` on its defaults, warm pool filled."""
    port = free_port()
    cmd = [sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker"]
    cmd += ["--port", str(port), "--pool-size", str(POOL), "--image", image]
    cmd += ["--runtime-dir", str(runtime), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with serving(cmd, port, POOL, up_within=90, env=env, cwd=tree) as url:
        yield url


def is_image(ref: str) -> bool:
    engine = docker.from_env()
    try:
        engine.images.get(ref)
        return True
    except (docker.errors.ImageNotFound, docker.errors.APIError):
        return False
    finally:
        engine.close()


def alternate(measure: Callable[[str], list[float]], rounds: int) -> dict[str, Any]:
    """`measure(side)` for each side in turn, `rounds` times; samples summarised per side."""
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(rounds):
        for side in SIDES:
            samples[side] += measure(side)
    return {side: summary(values) for side, values in samples.items()}


def round_trips(urls: dict[str, str], n: int) -> dict[str, Any]:
    """Warm `1+1` on a session of each gateway, in alternating batches."""
    sessions = {name: httpx.post(url + "/sessions").json()["id"] for name, url in urls.items()}
    for url in urls.values():
        wait_warm(url, POOL)
    calls = {name: (LeanSSE(url), sessions[name]) for name, url in urls.items()}

    def once(name: str) -> None:
        lean, sid = calls[name]
        lean.execute(sid, "1+1")

    try:
        for name in calls:
            timed(functools.partial(once, name), 20, warmup=0)
        batch = max(5, n // 20)
        return alternate(
            lambda side: timed(functools.partial(once, side), batch, warmup=1), max(1, n // batch)
        )
    finally:
        for lean, _ in calls.values():
            lean.close()
        for name, url in urls.items():
            httpx.delete(f"{url}/sessions/{sessions[name]}")


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


def raw_round_trips(images: dict[str, str], runtime: Path, n: int) -> dict[str, Any]:
    """`1+1` through plain jupyter_client to a kernel container of each image."""
    raws: dict[str, RawKernel] = {}
    try:
        for side, image in images.items():
            raws[side] = RawKernel(
                argparse.Namespace(image=image, runtime=None), runtime / f"raw-{side}"
            )
        for raw in raws.values():
            timed(raw.once, 20, warmup=0)
        batch = max(5, n // 20)
        return alternate(lambda side: timed(raws[side].once, batch, warmup=1), max(1, n // batch))
    finally:
        for raw in raws.values():
            raw.close()


def compare(args: argparse.Namespace) -> dict[str, Any]:
    base_is_image = is_image(args.base)
    runtime = Path(tempfile.mkdtemp(prefix="kg-ab-rt-"))
    results: dict[str, Any] = {"machine": machine()}
    small = max(5, args.iterations // 15)
    try:
        with ExitStack() as stack:
            if base_is_image:
                trees = {"base": REPO, "tree": REPO}
                images = {"base": args.base, "tree": args.image}
                names = {"base": f"image {args.base}", "tree": f"image {args.image}"}
            else:
                rev = _git("rev-parse", "--short", args.base)
                trees = {"base": stack.enter_context(worktree(args.base)), "tree": REPO}
                images = {"base": args.image, "tree": args.image}
                names = {
                    "base": f"base {rev}",
                    "tree": f"working tree (HEAD {_git('rev-parse', '--short', 'HEAD')})",
                }
            results["sides"] = names
            results["images"] = images
            urls = {
                side: stack.enter_context(gateway(trees[side], images[side], runtime / side))
                for side in SIDES
            }
            print("warm 1+1 round trips, interleaved…", flush=True)
            results["warm_round_trip"] = round_trips(urls, args.iterations)
            print("POST /execute print(1), one at a time…", flush=True)
            results["stateless_sequential"] = alternate(
                lambda side: stateless_sequential_samples(urls[side], 5, POOL), small
            )
            for concurrency in (1, 8):
                print(f"stateless print(1) at concurrency {concurrency}…", flush=True)
                results[f"stateless_c{concurrency}"] = throughput(
                    urls, args.seconds, concurrency, args.rounds
                )
            print("first chart in a fresh session…", flush=True)
            results["first_chart"] = alternate(
                lambda side: first_chart_samples(urls[side], 2, POOL),
                max(2, small // 2),
            )
        if base_is_image:
            print("raw 1+1 through jupyter_client (no gateway)…", flush=True)
            results["raw_round_trip"] = raw_round_trips(images, runtime, args.iterations)
            print("cold starts…", flush=True)
            results["cold_start"] = alternate(
                lambda side: cold_start_samples(images[side], runtime / f"cold-{side}", 2),
                max(2, small // 2),
            )
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    return results


def _git(*argv: str) -> str:
    return subprocess.run(
        ["git", *argv], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


ROWS: list[tuple[str, str, str]] = [  # (figure, statistic, label)
    ("raw_round_trip", "p50_ms", "`1+1`, plain jupyter_client to a kernel container, p50 (ms)"),
    ("warm_round_trip", "p50_ms", "warm `1+1` through the gateway, p50 (ms)"),
    ("warm_round_trip", "p99_ms", "warm `1+1` through the gateway, p99 (ms)"),
    ("stateless_sequential", "p50_ms", "`POST /execute` `print(1)`, one at a time, p50 (ms)"),
    ("stateless_c1", "requests_per_s", "stateless `print(1)`, concurrency 1 (req/s)"),
    ("stateless_c8", "requests_per_s", "stateless `print(1)`, concurrency 8 (req/s)"),
    ("first_chart", "p50_ms", "first chart in a fresh session, p50 (ms)"),
    ("cold_start", "p50_ms", "cold start, container to kernel ready, p50 (ms)"),
]


def table(results: dict[str, Any]) -> str:
    names = results["sides"]
    lines = [f"| figure | {names['base']} | {names['tree']} | ratio |", "|---|---|---|---|"]
    for key, stat, label in ROWS:
        if key not in results:
            continue
        base, tree = (results[key][side][stat] for side in SIDES)
        ratio = f"{tree / base:.2f}" if base else "-"
        lines.append(f"| {label} | {base} | {tree} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision or image tag to compare with")
    parser.add_argument("--image", default=os.environ.get("KG_IMAGE", DEFAULT_IMAGE))
    parser.add_argument("--iterations", type=int, default=400, help="warm 1+1 per side")
    parser.add_argument("--seconds", type=float, default=20, help="stateless load per side")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "ab.json")
    parser.add_argument("--smoke", action="store_true", help="tiny run, to check the bench works")
    args = parser.parse_args(argv)
    if args.smoke:
        args.iterations, args.seconds, args.rounds = 20, 0.5, 1
    results = compare(args)
    print()
    print(table(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""E2B's own SDK against the gateway, beside the gateway's own client, in one run.

    python -m bench.e2b              # 30 creates and 200 round trips per client
    python -m bench.e2b --smoke      # a tiny run, to check the bench works

- **create → first result**: E2B's `Sandbox.create()` then `run_code("1 + 1")` until its
  result, beside our client's `client.session()` then `1 + 1` until `done`; both on a warm
  kernel (the bench waits for the pool to refill before each), interleaved so the machine's
  drift hits both alike. Ending the sandbox or session is not timed.
- **round trip**: `run_code("1 + 1")` in an existing sandbox, beside `1 + 1` in an existing
  session through our client's SSE stream.

Asserts nothing; prints a table and writes bench/results/e2b.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2b_code_interpreter import Sandbox

from bench.languages import run_until_done, warm_pools
from bench.run import ROOT, free_port, machine, report, serving, summary, wait_until
from kernel_gateway.client import Client
from kernel_gateway.settings import DEFAULT_IMAGE

POOL = 2


def sdk_options(url: str) -> dict[str, Any]:
    return {"api_key": "e2b_bench", "api_url": url + "/e2b", "sandbox_url": url + "/e2b"}


def first_results(url: str, n: int) -> dict[str, Any]:
    """Create → first result, E2B's SDK and ours alternating."""
    e2b_samples: list[float] = []
    ours: list[float] = []
    options = sdk_options(url)
    with Client(url) as client:
        for _ in range(n):
            wait_until(lambda: warm_pools(url, {"python": POOL}), 120)
            t = time.perf_counter()
            sandbox = Sandbox.create(**options)
            try:
                if sandbox.run_code("1 + 1").text != "2":
                    raise RuntimeError("E2B's SDK did not get 2")
                e2b_samples.append(time.perf_counter() - t)
            finally:
                sandbox.kill()
            wait_until(lambda: warm_pools(url, {"python": POOL}), 120)
            t = time.perf_counter()
            with client.session() as session:
                run_until_done(session, "1 + 1")
                ours.append(time.perf_counter() - t)
    return {"e2b_sdk": summary(e2b_samples), "own_client": summary(ours)}


def round_trips(url: str, n: int) -> dict[str, Any]:
    """`1 + 1` in an existing sandbox and in an existing session, alternating."""
    e2b_samples: list[float] = []
    ours: list[float] = []
    sandbox = Sandbox.create(**sdk_options(url))
    try:
        with Client(url) as client, client.session() as session:
            steps: list[tuple[Callable[[], object], list[float]]] = [
                (lambda: sandbox.run_code("1 + 1"), e2b_samples),
                (lambda: run_until_done(session, "1 + 1"), ours),
            ]
            for _ in range(3):  # warm both paths
                for step, _samples in steps:
                    step()
            for _ in range(n):
                for step, samples in steps:
                    t = time.perf_counter()
                    step()
                    samples.append(time.perf_counter() - t)
    finally:
        sandbox.kill()
    return {"e2b_sdk": summary(e2b_samples), "own_client": summary(ours)}


def table(results: dict[str, Any]) -> str:
    rows = [
        "| measure | E2B's SDK p50 (p90) | our client p50 (p90) |",
        "|---|---|---|",
    ]
    for key, label in (("first_result", "create → first result"), ("round_trip", "`1 + 1`")):
        e2b, ours = results[key]["e2b_sdk"], results[key]["own_client"]
        rows.append(
            f"| {label} | {e2b['p50_ms']:.1f} ms ({e2b['p90_ms']:.1f}) | "
            f"{ours['p50_ms']:.1f} ms ({ours['p90_ms']:.1f}) |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--creates", type=int, default=30, help="creates per client")
    parser.add_argument("--iterations", type=int, default=200, help="round trips per client")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the kernel image")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "e2b.json")
    args = parser.parse_args()
    creates = 3 if args.smoke else args.creates
    n = 5 if args.smoke else args.iterations
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-e2b-"))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "kernel_gateway",
        "serve",
        "--backend",
        "docker",
        "--port",
        str(port),
        "--image",
        args.image,
        "--pool-size",
        str(POOL),
        "--stateless-mode",
        "container",
        "--runtime-dir",
        str(runtime),
        "--log-level",
        "warning",
    ]
    try:
        with serving(cmd, port, POOL, up_within=60) as url:
            print("create → first result…", flush=True)
            results["first_result"] = first_results(url, creates)
            print("round trips…", flush=True)
            results["round_trip"] = round_trips(url, n)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    report(results, [table(results)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

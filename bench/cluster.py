"""Cluster bench: the routing tier on a real three-node swarm versus a single gateway.

    python -m bench.cluster            # about 5 minutes; prints a table, writes JSON

It brings up the test swarm of tests/integration/cluster (the manager engine and two worker engines
in network namespaces on this machine), deploys deploy/stack.yml on it, and measures,
through one router and against a single `kernel-gateway serve` on this host with the
same limits and, like the nodes, `--persist-sessions`, in one run:

- warm `1+1`: an SSE round trip on an existing session (httpx);
- session create: `POST /sessions` with warm kernels waiting;
- streaming lag: how late each line printed every 100 ms arrives;
- sessions per second: a burst of concurrent `POST /sessions` up to the capacity.

Asserts nothing. Every node of the test swarm shares this machine's cores, so the
cluster's figures show the router's cost, not the added machines' capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.run import (
    JSON_HEADERS,
    free_port,
    machine,
    read_until_done,
    streaming_lag_with,
    summary,
    timed,
    wait_until,
)
from kernel_gateway.cli.gateway_image import build_gateway_image
from kernel_gateway.cli.main import default_cache_dir
from kernel_gateway.settings import DEFAULT_GATEWAY_IMAGE, DEFAULT_IMAGE
from tests.support.deployment import Deployment, deploy, remove
from tests.support.swarm import Swarm

ROOT = Path(__file__).resolve().parent
PER_NODE = 6
POOL = 2


def round_trips(http: httpx.Client, n: int) -> dict[str, Any]:
    sid = http.post("/sessions").json()["id"]

    def once() -> None:
        with http.stream(
            "POST", f"/sessions/{sid}/execute", json={"code": "1+1"}, headers=JSON_HEADERS
        ) as response:
            read_until_done(response)

    samples = timed(once, n, warmup=10)
    http.delete(f"/sessions/{sid}")
    return summary(samples)


def warm_everywhere(http: httpx.Client, router: bool) -> bool:
    health = http.get("/health").json()
    if router:
        return all(n["state"] == "up" and n["warm"] >= POOL for n in health["nodes"])
    return bool(health["pool"]["warm"] >= POOL)


def creates(http: httpx.Client, n: int, router: bool) -> dict[str, Any]:
    samples = []
    for _ in range(n):
        wait_until(lambda: warm_everywhere(http, router), 120)
        time.sleep(1.2 if router else 0)  # the routers' view of the pools is a poll old
        t = time.perf_counter()
        sid = http.post("/sessions").json()["id"]
        samples.append(time.perf_counter() - t)
        http.delete(f"/sessions/{sid}")
    return summary(samples)


def burst(url: str, headers: dict[str, str], count: int) -> dict[str, Any]:
    """`count` sessions asked for at once; how many per second were made."""

    def one(_: int) -> tuple[int, str]:
        answer = httpx.post(url + "/sessions", headers=headers, timeout=120)
        return answer.status_code, answer.json().get("id", "")

    t = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        made = list(pool.map(one, range(count)))
    elapsed = time.perf_counter() - t
    ok = [sid for status, sid in made if status == 201]
    nodes = {sid.partition(".")[0] for sid in ok if "." in sid}
    for sid in ok:
        httpx.delete(f"{url}/sessions/{sid}", headers=headers, timeout=60)
    return {
        "asked": count,
        "made": len(ok),
        "seconds": round(elapsed, 3),
        "per_second": round(len(ok) / elapsed, 2),
        "nodes": len(nodes),
    }


def measure(url: str, headers: dict[str, str], router: bool, args: argparse.Namespace) -> Any:
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        return {
            "warm_1plus1": round_trips(http, args.n),
            "session_create": creates(http, args.creates, router),
            "streaming_lag": streaming_lag_with(url, 30, token=headers["Authorization"][7:]),
            "burst": burst(url, headers, args.burst),
        }


def single_gateway(args: argparse.Namespace, token: str) -> Any:
    import subprocess

    port = free_port()
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-single-"))
    cmd = [sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker"]
    cmd += ["--port", str(port), "--token", token, "--runtime-dir", str(runtime)]
    cmd += ["--pool-size", str(POOL), "--max-sessions", str(3 * PER_NODE), "--log-level", "warning"]
    cmd += ["--persist-sessions", "--drain-timeout", "5"]  # as the nodes run
    env = {**os.environ, "KG_FORK_SERVERS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        headers = {"Authorization": f"Bearer {token}"}

        def up() -> bool:
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 120)
        return measure(url, headers, False, args)
    finally:
        proc.terminate()
        proc.wait(60)


def table(results: dict[str, Any]) -> str:
    rows = [("", "single gateway", "through a router (3 nodes)")]
    s, c = results["single"], results["cluster"]
    for label, key in (("warm 1+1", "warm_1plus1"), ("session create", "session_create")):
        rows.append(
            (
                f"{label} p50 / p99 (ms)",
                f"{s[key]['p50_ms']:.2f} / {s[key]['p99_ms']:.2f}",
                f"{c[key]['p50_ms']:.2f} / {c[key]['p99_ms']:.2f}",
            )
        )
    rows.append(
        (
            "streaming lag p50 / p99 (ms)",
            f"{s['streaming_lag']['p50_ms']:.2f} / {s['streaming_lag']['p99_ms']:.2f}",
            f"{c['streaming_lag']['p50_ms']:.2f} / {c['streaming_lag']['p99_ms']:.2f}",
        )
    )
    rows.append(
        (
            "sessions/s in a burst (made/asked, nodes)",
            f"{s['burst']['per_second']} ({s['burst']['made']}/{s['burst']['asked']})",
            f"{c['burst']['per_second']} ({c['burst']['made']}/{c['burst']['asked']}, "
            f"{c['burst']['nodes']} nodes)",
        )
    )
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, width, strict=True)) for r in rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="warm round trips")
    parser.add_argument("--creates", type=int, default=20, help="timed session creates")
    parser.add_argument("--burst", type=int, default=3 * PER_NODE, help="sessions in the burst")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "cluster.json")
    args = parser.parse_args()
    build_gateway_image(
        DEFAULT_GATEWAY_IMAGE, DEFAULT_IMAGE, lambda _: None, cache_dir=default_cache_dir({})
    )
    swarm = Swarm.start(workers=2, images=[DEFAULT_IMAGE, DEFAULT_GATEWAY_IMAGE])
    results: dict[str, Any] = {"machine": machine()}
    try:
        deployment: Deployment = deploy(swarm, max_sessions=PER_NODE, pool_size=POOL)
        try:
            headers = {"Authorization": f"Bearer {deployment.token}"}
            results["cluster"] = measure(deployment.url(swarm.manager), headers, True, args)
        finally:
            remove(deployment)
    finally:
        swarm.stop()
    results["single"] = single_gateway(args, "bench-token")
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

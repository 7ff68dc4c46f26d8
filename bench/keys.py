"""One API key's flood of stateless requests against another key's canary, in one run.

    python -m bench.keys                 # 4 rounds of 10 s: the canary alone, then beside
                                         # the flood, interleaved
    python -m bench.keys --max-stateless 2   # the flooding key's quota
    python -m bench.keys --smoke         # a tiny run, to check the bench works

A gateway (docker backend, a token, the defaults otherwise) with two API keys: `flood`
sends stateless `print(1)` from `--concurrency` keep-alive connections as fast as it is
answered (waiting out each 429's `Retry-After`); `canary` runs `1+1` in a warm session of
its own, one cell at a time. Each round measures the canary alone, then with the flood
going, so drift on the machine hits both alike. The issue's target: the canary's p99 under
the flood within 20% of its p99 alone.

Asserts nothing; prints a table and writes bench/results/keys.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.run import ROOT, free_port, machine, report, serving, summary
from kernel_gateway.settings import DEFAULT_IMAGE

JSON = {"Accept": "application/json"}


def flood(url: str, secret: str, concurrency: int, stop: threading.Event) -> dict[str, int]:
    """Stateless `print(1)` from `concurrency` lean keep-alive connections until `stop`."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"code": "print(1)"}).encode()
    request = (
        f"POST /execute HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nAuthorization: Bearer {secret}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    counts = {"ok": 0, "refused": 0}

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not stop.is_set():
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length, retry = 0, 1.0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                    elif name.lower() == b"retry-after":
                        retry = float(value)
                await reader.readexactly(length)
                if status == 200:
                    counts["ok"] += 1
                else:
                    counts["refused"] += 1
                    await asyncio.sleep(retry)
        finally:
            writer.close()

    async def run() -> None:
        await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())
    return counts


def canary(http: httpx.Client, session_id: str, seconds: float) -> list[float]:
    """`1+1` in the canary's session, one at a time, for `seconds`: each round trip (s)."""
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        answer = http.post(f"/sessions/{session_id}/execute", json={"code": "1+1"}, headers=JSON)
        samples.append(time.perf_counter() - t)
        assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10, help="each phase of a round")
    parser.add_argument("--concurrency", type=int, default=16, help="the flood's connections")
    parser.add_argument(
        "--max-stateless", type=int, default=4, help="the flooding key's quota (0: none)"
    )
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the kernel image")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "keys.json")
    args = parser.parse_args()
    rounds, seconds = (1, 2.0) if args.smoke else (args.rounds, args.seconds)
    token = secrets.token_hex(16)
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-keys-"))
    port = free_port()
    cmd = [sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker"]
    cmd += ["--port", str(port), "--image", args.image, "--runtime-dir", str(runtime)]
    cmd += ["--token", token, "--log-level", "warning"]
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    try:
        with serving(cmd, port, 2, up_within=90) as url:
            admin = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
            quota = {"max_stateless": args.max_stateless} if args.max_stateless else {}
            made = {
                name: admin.post("/keys", json={"name": name, "quotas": q}).json()
                for name, q in (("flood", quota), ("canary", {}))
            }
            http = httpx.Client(
                base_url=url,
                headers={"Authorization": f"Bearer {made['canary']['secret']}"},
                timeout=60,
            )
            session_id = http.post("/sessions").json()["id"]
            canary(http, session_id, 1.0)  # warm
            alone: list[float] = []
            beside: list[float] = []
            counts = {"ok": 0, "refused": 0}
            flooded = 0.0
            for _ in range(rounds):
                alone += canary(http, session_id, seconds)
                stop = threading.Event()
                outcome: dict[str, dict[str, int]] = {}

                def flooding(stop: threading.Event, outcome: dict[str, dict[str, int]]) -> None:
                    outcome["n"] = flood(url, made["flood"]["secret"], args.concurrency, stop)

                thread = threading.Thread(target=flooding, args=(stop, outcome))
                thread.start()
                time.sleep(1.0)  # the flood under way
                beside += canary(http, session_id, seconds)
                stop.set()
                thread.join()
                flooded += seconds + 1.0
                for name in counts:
                    counts[name] += outcome["n"][name]
            results["canary_alone"] = summary(alone)
            results["canary_beside_flood"] = summary(beside)
            results["p99_ratio"] = round(
                results["canary_beside_flood"]["p99_ms"] / results["canary_alone"]["p99_ms"], 2
            )
            results["flood"] = {
                "concurrency": args.concurrency,
                "max_stateless": args.max_stateless or None,
                "completed_per_s": round(counts["ok"] / flooded, 1),
                "refused_429": counts["refused"],
            }
            http.close()
            admin.close()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    a, b = results["canary_alone"], results["canary_beside_flood"]
    table = "\n".join(
        [
            "| canary `1+1` (ms) | alone | beside the flood | ratio |",
            "|---|---|---|---|",
            f"| p50 | {a['p50_ms']} | {b['p50_ms']} | {round(b['p50_ms'] / a['p50_ms'], 2)} |",
            f"| p99 | {a['p99_ms']} | {b['p99_ms']} | {results['p99_ratio']} |",
            "",
            f"flood: {args.concurrency} connections, max_stateless "
            f"{args.max_stateless or 'none'}: {results['flood']['completed_per_s']} req/s done, "
            f"{counts['refused']} refused (429); target: p99 ratio ≤ 1.2",
        ]
    )
    report(results, [table], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

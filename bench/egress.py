"""What network by policy costs: the egress proxy's memory, and a request through it next
to the same request made directly, in one run.

    python -m bench.egress            # 200 requests each way, a 20 MB download 5 times
    python -m bench.egress --smoke    # a tiny run, to check the bench works

An upstream (the kernel image serving files over HTTP) runs on an internal Docker network
made for the run; nothing leaves the machine. "proxied" runs in a gateway session allowed
`bench.test`: kernel -> forwarder -> relay -> squid -> upstream. "direct" runs the same code
in a container on the upstream's network. Each request opens its own connection (as pip's
and most scripts' first requests do).

Asserts nothing; prints a table and writes bench/results/egress.json.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker
import docker.types
import httpx

from bench.run import ROOT, free_port, machine, report, serving
from kernel_gateway.settings import DEFAULT_IMAGE

SUBNET = "203.0.113.0/24"  # TEST-NET-3: not a private range, so the proxy lets it through
# (tests/integration/test_egress.py takes TEST-NET-2: the two may run at once)
MEASURE = """
import json, statistics, time, urllib.request
def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return len(answer.read())
deadline = time.monotonic() + 90  # the name resolves once the engine's DNS knows the upstream
while True:
    try:
        get("http://bench.test/small", timeout=10)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
times = []
for _ in range({n}):
    t = time.perf_counter()
    get("http://bench.test/small")
    times.append((time.perf_counter() - t) * 1000)
big = []
for _ in range({downloads}):
    t = time.perf_counter()
    size = get("http://bench.test/big")
    big.append(size / 2**20 / (time.perf_counter() - t))
times.sort()
print(json.dumps({{
    "p50_ms": round(times[len(times) // 2], 2),
    "p90_ms": round(times[int(len(times) * 0.9)], 2),
    "download_mib_s": round(statistics.median(big), 1),
}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the kernel image")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "egress.json")
    args = parser.parse_args()
    n = 10 if args.smoke else args.requests
    downloads = 1 if args.smoke else 5
    code = MEASURE.format(n=n, downloads=downloads)
    client = docker.from_env()
    tag = secrets.token_hex(3)
    folder = Path(tempfile.mkdtemp(prefix="kg-bench-egress-"))
    folder.chmod(0o755)
    (folder / "small").write_bytes(b"x" * 1024)
    (folder / "big").write_bytes(secrets.token_bytes(20 * 2**20))
    for path in folder.iterdir():
        path.chmod(0o644)
    pool = docker.types.IPAMPool(subnet=SUBNET)
    net = f"kg-bench-egress-{tag}"
    network = client.networks.create(
        net, internal=True, ipam=docker.types.IPAMConfig(pool_configs=[pool])
    )
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-egress-gw-"))
    upstream = None
    try:
        upstream = client.containers.run(
            args.image,
            ["/opt/venv/bin/python", "-m", "http.server", "80", "--directory", "/srv"],
            name=f"kg-bench-up-{tag}",
            user="0:0",
            detach=True,
            volumes={str(folder): {"bind": "/srv", "mode": "ro"}},
            network=net,
            networking_config={net: client.api.create_endpoint_config(aliases=["bench.test"])},
        )
        direct = client.containers.run(
            args.image,
            ["/opt/venv/bin/python", "-c", code],
            network=net,
            remove=True,
            stdout=True,
            stderr=True,
        )
        results["direct"] = json.loads(direct.decode().strip().splitlines()[-1])
        port = free_port()
        cmd = [
            sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker",
            "--port", str(port), "--image", args.image, "--pool-size", "1",
            "--stateless-mode", "container",
            "--runtime-dir", str(runtime), "--log-level", "warning",
            "--egress-allow", "bench.test", "--egress-networks", net,
        ]  # fmt: skip
        with serving(cmd, port, 1, up_within=90) as url:
            made = httpx.post(
                url + "/sessions", json={"network": {"allow": ["bench.test"]}}, timeout=120
            )
            made.raise_for_status()
            sid = made.json()["id"]
            answer = httpx.post(
                f"{url}/sessions/{sid}/execute",
                json={"code": code, "timeout": 600},
                headers={"Accept": "application/json"},
                timeout=700,
            ).json()
            proxies = [
                proxy
                for proxy in client.containers.list(filters={"name": "kg-egress-"})
                if net
                in proxy.attrs["NetworkSettings"]["Networks"]  # this gateway's, not another's
            ]
            if answer.get("status") != "ok":
                logs = proxies[0].logs(tail=30).decode(errors="replace") if proxies else ""
                raise SystemExit(
                    f"the proxied run failed: {json.dumps(answer)[:3000]}\n"
                    f"the egress proxy's last log lines:\n{logs}"
                )
            results["proxied"] = json.loads(answer["stdout"].strip().splitlines()[-1])
            stats: dict[str, Any] = proxies[0].stats(stream=False) if proxies else {}  # type: ignore[assignment]
            usage = stats.get("memory_stats", {})
            cache = usage.get("stats", {}).get("inactive_file", 0)
            results["proxy_memory_mib"] = round((usage.get("usage", 0) - cache) / 2**20, 1)
    finally:
        if upstream is not None:
            upstream.remove(force=True)
        network.reload()
        for attached in network.containers:  # a gateway that did not stop may leave its proxy
            network.disconnect(attached, force=True)
        network.remove()
        client.close()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
    d, p, memory = results["direct"], results["proxied"], results["proxy_memory_mib"]
    rows = [
        "| measure | direct | through the egress proxy |",
        "|---|---|---|",
        f"| HTTP GET, new connection, p50 (p90) | {d['p50_ms']} ms ({d['p90_ms']}) | "
        f"{p['p50_ms']} ms ({p['p90_ms']}) |",
        f"| 20 MiB download | {d['download_mib_s']} MiB/s | {p['download_mib_s']} MiB/s |",
        f"| the proxy's memory (squid, its helpers, socat) | – | {memory} MiB |",
    ]
    report(results, ["\n".join(rows)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

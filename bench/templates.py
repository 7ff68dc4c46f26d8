"""Templates: the time to build a small one, and create → first result on a warm template
beside the default image, interleaved in one run, on the docker backend.

    python -m bench.templates                # 30 rounds
    python -m bench.templates --smoke        # a tiny run, to check the bench works

- **build**: `POST /templates` (a RUN, an ENV and a COPY of a small file) until its build is
  `ready`, its log followed: uncached (`force`), then the same build again, cached.
- **create → first result**: `POST /sessions` (with `{"template": ...}`, or none for the
  default image), `1 + 1` until its `done`, then `DELETE`; one of each per round, in
  alternating order, each taken with a warm kernel ready (the bench waits for it: the
  template's pool keeps one warm while it is used, the default pool `--pool-size`).
- **E2B's SDK, create → first result**: `Sandbox.create("alias")` (or `Sandbox.create()`
  for the default image), `run_code("1 + 1")`, `kill()`; in the same rounds, each taken
  with both pools warm as above.

Asserts nothing; prints a table and writes bench/results/templates.json.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from e2b_code_interpreter import Sandbox

from bench.e2b import sdk_options
from bench.run import ROOT, free_port, machine, report, serving, summary, wait_until, wait_warm
from kernel_gateway.client.sse import iter_events
from kernel_gateway.settings import DEFAULT_IMAGE

POOL = 1


def context() -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"a,b\n1,2\n"
        info = tarfile.TarInfo("data/table.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def build(client: httpx.Client, name: str, *, force: bool, first: bool) -> tuple[float, str]:
    """Seconds from `POST` to `ready`, and the build's image."""
    body: dict[str, Any] = {
        "steps": [
            {"type": "RUN", "args": ["echo made > /opt/marker", "root"]},
            {"type": "ENV", "args": ["DATASET", "/opt/data/table.csv"]},
            {"type": "COPY", "args": ["data", "/opt/data/"]},
        ],
        "context": context(),
        "force": force,
    }
    began = time.monotonic()
    if first:
        response = client.post("/templates", json={"name": name, **body})
    else:
        response = client.post(f"/templates/{name}/builds", json=body)
    response.raise_for_status()
    started = response.json()
    path = f"/templates/{name}/builds/{started['id']}/logs"
    ended: dict[str, Any] | None = None
    with client.stream("GET", path, timeout=600) as logs:
        for event in iter_events(logs.iter_bytes()):
            if event.event == "end":
                ended = event.json()
    took = time.monotonic() - began
    if ended is None or ended["state"] != "ready":
        raise SystemExit(f"the build did not end ready: {ended}")
    return took, str(ended["image"])


def first_result(client: httpx.Client, template: str | None) -> float:
    began = time.monotonic()
    created = client.post("/sessions", json={"template": template} if template else None)
    created.raise_for_status()
    sid = created.json()["id"]
    with client.stream("POST", f"/sessions/{sid}/execute", json={"code": "1 + 1"}) as response:
        for event in iter_events(response.iter_bytes()):
            if event.event == "done":
                break
    took = time.monotonic() - began
    client.delete(f"/sessions/{sid}")
    return took


def e2b_first_result(url: str, template: str | None) -> float:
    began = time.monotonic()
    options = sdk_options(url)
    sandbox = Sandbox.create(template, **options) if template else Sandbox.create(**options)
    try:
        if sandbox.run_code("1 + 1").text != "2":
            raise SystemExit("E2B's SDK did not get 2")
        return time.monotonic() - began
    finally:
        sandbox.kill()


def wait_template_warm(client: httpx.Client, name: str) -> None:
    """Until the template's pool has a warm kernel ready (no session holds one between
    rounds)."""

    def warm() -> bool:
        return int(client.get(f"/templates/{name}").json()["warm"]) >= 1

    wait_until(warm, 120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--rounds", type=int, default=30, help="create → first result, each")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the Python kernel image")
    parser.add_argument("--runtime", default=None, help="OCI runtime, e.g. runsc")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "templates.json")
    args = parser.parse_args()
    rounds = 2 if args.smoke else args.rounds
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-templates-"))
    port = free_port()
    cmd = [
        sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker",
        "--port", str(port), "--image", args.image, "--pool-size", str(POOL),
        "--stateless-mode", "container",
        "--runtime-dir", str(runtime), "--log-level", "warning",
        *(["--runtime", args.runtime] if args.runtime else []),
    ]  # fmt: skip
    name = f"bench-{uuid.uuid4().hex[:8]}"
    with (
        serving(cmd, port, POOL, up_within=60) as url,
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        print("build: uncached…", flush=True)
        uncached, _ = build(client, name, force=True, first=True)
        print("build: cached…", flush=True)
        cached, _ = build(client, name, force=False, first=False)
        results["build_s"] = {"uncached": round(uncached, 2), "cached": round(cached, 2)}
        first_result(client, name)  # the template's pool is made and starts its warm kernel
        samples: dict[tuple[str, bool], list[float]] = {
            (api, templated): [] for api in ("ours", "e2b") for templated in (False, True)
        }
        for i in range(rounds):
            print(f"round {i + 1}/{rounds}…", flush=True)
            order = [None, name] if i % 2 == 0 else [name, None]
            for api in ("ours", "e2b"):
                for template in order:
                    # Both pools full before each create: the other one's refill (a
                    # container starting, about a second of CPU on 2 cores) would otherwise
                    # run beside it.
                    wait_warm(url, POOL)
                    wait_template_warm(client, name)
                    took = (
                        first_result(client, template)
                        if api == "ours"
                        else e2b_first_result(url, template)
                    )
                    samples[api, template is not None].append(took)
        results["create_first_result"] = {
            "default": summary(samples["ours", False]),
            "template": summary(samples["ours", True]),
        }
        results["e2b_create_first_result"] = {
            "default": summary(samples["e2b", False]),
            "template": summary(samples["e2b", True]),
        }
        client.delete(f"/templates/{name}")
    d, t = results["create_first_result"]["default"], results["create_first_result"]["template"]
    ratio = t["p50_ms"] / d["p50_ms"] if d["p50_ms"] else float("nan")
    results["template_over_default_p50"] = round(ratio, 3)
    ed, et = (
        results["e2b_create_first_result"]["default"],
        results["e2b_create_first_result"]["template"],
    )
    e2b_ratio = et["p50_ms"] / ed["p50_ms"] if ed["p50_ms"] else float("nan")
    results["e2b_template_over_default_p50"] = round(e2b_ratio, 3)
    table = "\n".join(
        [
            "| figure | default image | template |",
            "|---|---|---|",
            f"| create → first result p50 | {d['p50_ms']:.1f} ms | {t['p50_ms']:.1f} ms "
            f"({ratio:.2f}×) |",
            f"| create → first result p90 | {d['p90_ms']:.1f} ms | {t['p90_ms']:.1f} ms |",
            f"| E2B's `Sandbox.create` → first `run_code` p50 | {ed['p50_ms']:.1f} ms | "
            f"{et['p50_ms']:.1f} ms ({e2b_ratio:.2f}×) |",
            f"| E2B's `Sandbox.create` → first `run_code` p90 | {ed['p90_ms']:.1f} ms | "
            f"{et['p90_ms']:.1f} ms |",
            f"| build a small template (RUN, ENV, COPY) | | {uncached:.1f} s uncached, "
            f"{cached:.1f} s cached |",
        ]
    )
    report(results, [table], args.json)


if __name__ == "__main__":
    main()

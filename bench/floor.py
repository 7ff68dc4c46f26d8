"""The floor of a stateless request on this machine: what no gateway can beat.

    python -m bench.floor                    # forks/s at 1, 8 and 32 in flight, 10 s each

A Python process of the kernel image, with the gateway's preload done (numpy, pandas,
matplotlib and a first chart, as in a fork server), forks a child per request; the
child runs `print(1)` (compiled from source, as a cell is) with its stdout on a pipe and
exits; the parent reads the pipe and reaps the child, keeping `concurrency` children
in flight. It runs in a container of the image on the same cores as everything else,
so the gateway's stateless figures divided by these are the share of the machine's
floor it reaches (bench/run.py prints that ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from kernel_gateway.kernels.pools.warm import preload_code
from kernel_gateway.settings import DEFAULT_IMAGE, Settings

PROGRAM = r"""
import gc, json, os, selectors, sys, time
exec(sys.argv[1], {})
gc.collect()
gc.freeze()
SOURCE = "print(1)"


def run(seconds, inflight):
    selector = selectors.DefaultSelector()
    live, latencies = {}, []
    stop = time.monotonic() + seconds

    def spawn():
        read_end, write_end = os.pipe()
        began = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            os.dup2(write_end, 1)
            sys.stdout = os.fdopen(1, "w")
            exec(compile(SOURCE, "<cell>", "exec"), {})
            sys.stdout.flush()
            os._exit(0)
        os.close(write_end)
        live[read_end] = (pid, began, [])
        selector.register(read_end, selectors.EVENT_READ)

    started = time.monotonic()
    while time.monotonic() < stop or live:
        while len(live) < inflight and time.monotonic() < stop:
            spawn()
        for key, _ in selector.select(1):
            data = os.read(key.fd, 65536)
            if data:
                live[key.fd][2].append(data)
                continue
            selector.unregister(key.fd)
            os.close(key.fd)
            pid, began, out = live.pop(key.fd)
            os.waitpid(pid, 0)
            if b"".join(out) != b"1\n":
                raise SystemExit(f"a child printed {out!r}")
            latencies.append(time.perf_counter() - began)
    elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "forks_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "completed": len(latencies),
    }


seconds = float(sys.argv[2])
print(json.dumps({c: run(seconds, int(c)) for c in sys.argv[3].split(",")}))
"""


def fork_floor(
    image: str, seconds: float, concurrencies: list[int], preload: list[str] | None = None
) -> dict[int, dict[str, Any]]:
    """Forks per second (and p50 of one fork's round trip) at each concurrency."""
    modules = Settings().preload_list if preload is None else preload
    code = preload_code(modules)
    figures = python_in_image(
        image,
        PROGRAM,
        [code, str(seconds), ",".join(map(str, concurrencies))],
        # As in a fork server: pyarrow's allocator thread would make every fork unsafe.
        docker_args=["--env", "JE_ARROW_MALLOC_CONF=background_thread:false"],
    )
    return {int(c): result for c, result in figures.items()}


def python_in_image(
    image: str, program: str, args: list[str], docker_args: list[str] | None = None
) -> Any:
    """Run `program` with the image's Python in a throwaway container with no network;
    return the last line it printed that is a JSON object, parsed."""
    result = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", *(docker_args or [])]
        + ["--entrypoint", "python", image, "-c", program, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"the program in {image} printed nothing: {result.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=os.environ.get("KG_IMAGE", DEFAULT_IMAGE))
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", default="1,8,32")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    floor = fork_floor(args.image, args.seconds, concurrencies)
    for c, figures in floor.items():
        rate, p50 = figures["forks_per_s"], figures["p50_ms"]
        print(f"floor at {c:>2} in flight: {rate:>7} forks/s, p50 {p50} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per language, in one run: image size, cold start, warm create -> first result, round trip.

    python -m bench.languages                # every language the images provide
    python -m bench.languages --smoke        # a tiny run, to check the bench works
    python -m bench.languages --languages python,r

- **image**: the language image's size, and what it adds over the Python image it is
  built on (the layers below are shared on disk and in the page cache).
- **cold start**: container create -> the kernel answers kernel_info (what a session
  pays when no warm kernel of its language is ready), measured on the backend directly.
- **warm create -> first result**: `POST /sessions {"language"}` on a warm kernel, then
  the language's `1+1` until `done`: what a client waits for its first answer.
- **round trip**: the `1+1` cell in an existing session, through the SSE stream.
- **first chart** (Python, R): a session's first plot, from a warm kernel, until the PNG.

Asserts nothing; prints a table and writes bench/results/languages.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
import httpx

from bench.run import (
    ROOT,
    cold_starts,
    free_port,
    machine,
    report,
    serving,
    summary,
    wait_until,
)
from kernel_gateway.client import Client, Display, Done
from kernel_gateway.kernels.languages import family_image, family_of
from kernel_gateway.settings import DEFAULT_IMAGE

ONE_PLUS_ONE = {
    "python": "1 + 1",
    "javascript": "1 + 1",
    "typescript": "const two: number = 1 + 1; two",
    "r": "1 + 1",
    "bash": "echo $((1 + 1))",
    "java": "1 + 1",
}
FIRST_CHART = {
    "python": "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9, 16])\nplt.show()",
    "r": "plot(1:10)",
}


def image_sizes(image: str, languages: list[str]) -> dict[str, Any]:
    client = docker.from_env()
    try:
        base = client.images.get(image).attrs["Size"] / 1e6
        out: dict[str, Any] = {"python": {"image": image, "mb": round(base)}}
        for language in languages:
            family = family_of(language)
            if family is None:
                continue
            name = family_image(image, family)
            size = client.images.get(name).attrs["Size"] / 1e6
            out[language] = {"image": name, "mb": round(size), "added_mb": round(size - base)}
        return out
    finally:
        client.close()


def warm_pools(url: str, want: dict[str, int]) -> bool:
    try:
        languages = httpx.get(url + "/languages", timeout=5).json()["languages"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    warm = {lang["name"]: lang["pool"]["warm"] for lang in languages}
    return all(warm.get(name, 0) >= count for name, count in want.items())


def run_until_done(session: Any, code: str) -> Done:
    for event in session.stream(code):
        if isinstance(event, Done):
            if event.status != "ok":
                raise RuntimeError(f"{code!r} ended {event.status}")
            return event
    raise RuntimeError("the stream ended without done")


def warm_first_result(url: str, language: str, n: int, pool: int) -> dict[str, Any]:
    samples = []
    with Client(url) as client:
        for _ in range(n):
            wait_until(lambda: warm_pools(url, {language: pool}), 180)
            t = time.perf_counter()
            with client.session(language=language) as session:
                run_until_done(session, ONE_PLUS_ONE[language])
                samples.append(time.perf_counter() - t)
    return summary(samples)


def round_trip(url: str, language: str, n: int) -> dict[str, Any]:
    samples = []
    with Client(url) as client, client.session(language=language) as session:
        for _ in range(3):
            run_until_done(session, ONE_PLUS_ONE[language])
        for _ in range(n):
            t = time.perf_counter()
            run_until_done(session, ONE_PLUS_ONE[language])
            samples.append(time.perf_counter() - t)
    return summary(samples)


def first_chart(url: str, language: str, n: int, pool: int) -> dict[str, Any]:
    samples = []
    with Client(url) as client:
        for _ in range(n):
            wait_until(lambda: warm_pools(url, {language: pool}), 180)
            with client.session(language=language) as session:
                t = time.perf_counter()
                for event in session.stream(FIRST_CHART[language]):
                    if isinstance(event, Display) and event.png:
                        samples.append(time.perf_counter() - t)
                        break
                else:
                    raise RuntimeError(f"no chart from {language}")
    return summary(samples)


def table(results: dict[str, Any]) -> str:
    rows = [
        "| language | image (MB) | added (MB) | cold start p50 | warm create → first result "
        "p50 | round trip p50 | first chart p50 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results["languages"].items():
        size = results["images"].get(name, {})
        chart = r.get("first_chart")
        rows.append(
            f"| {name} | {size.get('mb', '')} | {size.get('added_mb', 0)} | "
            f"{r['cold_start']['p50_ms']:.0f} ms | {r['warm_first_result']['p50_ms']:.0f} ms | "
            f"{r['round_trip']['p50_ms']:.1f} ms | "
            + (f"{chart['p50_ms']:.0f} ms |" if chart else "– |")
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--iterations", type=int, default=100, help="round trips per language")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the Python kernel image")
    parser.add_argument(
        "--languages",
        default="python,javascript,typescript,r,bash,java",
        help="comma-separated (default: all six)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "languages.json")
    args = parser.parse_args()
    n = 3 if args.smoke else args.iterations
    small = 2 if args.smoke else max(5, n // 10)
    languages = [name.strip() for name in args.languages.split(",") if name.strip()]
    pool = 1
    results: dict[str, Any] = {
        "machine": machine(),
        "mode": "smoke" if args.smoke else "full",
        "images": image_sizes(args.image, languages),
        "languages": {},
    }
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-languages-"))
    try:
        for language in languages:
            print(f"{language}: cold start…", flush=True)
            results["languages"][language] = {
                "cold_start": cold_starts(
                    args.image, runtime / f"cold-{language}", small, language=language
                )
            }
        port = free_port()
        others = ",".join(f"{name}={pool}" for name in languages if name != "python")
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
            str(pool),
            "--stateless-mode",
            "container",
            "--runtime-dir",
            str(runtime / "gw"),
            "--log-level",
            "warning",
            "--languages",
            ",".join(languages),
            *(["--language-pool", others] if others else []),
        ]
        with serving(cmd, port, pool, up_within=60) as url:
            for language in languages:
                entry = results["languages"][language]
                print(f"{language}: warm create → first result…", flush=True)
                entry["warm_first_result"] = warm_first_result(url, language, small, pool)
                print(f"{language}: round trip…", flush=True)
                entry["round_trip"] = round_trip(url, language, n)
                if language in FIRST_CHART:
                    print(f"{language}: first chart…", flush=True)
                    entry["first_chart"] = first_chart(url, language, small, pool)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    report(results, [table(results)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

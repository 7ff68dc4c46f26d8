"""Benchmarks for kernel-gateway: prints a table and writes JSON. Asserts nothing.

    python bench/run.py                 # full run, docker backend (a few minutes)
    python bench/run.py --smoke         # tiny run, to check the bench works
    python bench/run.py --compare-jkg   # also measure Jupyter Kernel Gateway, same workloads
    python bench/run.py --image-only --image IMG   # cold start and first chart of one image

It starts its own gateway (`kernel-gateway serve` in a subprocess) and, for the
baseline, a kernel container from the same image driven by plain jupyter_client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
from jupyter_client.blocking.client import BlockingKernelClient

from kernel_gateway.client import Client, Display, Done, Stdout
from kernel_gateway.client.sse import iter_events
from kernel_gateway.kernels.backends.docker import DockerBackend
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.settings import DEFAULT_IMAGE, Settings

try:
    from bench.floor import fork_floor
except ModuleNotFoundError:  # run as `python bench/run.py`: bench/ is the path's first entry
    from floor import fork_floor  # type: ignore[import-not-found,no-redef]

ROOT = Path(__file__).resolve().parent
JSON_HEADERS = {"Content-Type": "application/json"}

# -- statistics --------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 0.5), 3),
        "p90_ms": round(pct(ms, 0.9), 3),
        "p99_ms": round(pct(ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else float("nan"),
    }


def timed(fn: Callable[[], object], n: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


# -- the machine -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    engine = docker.from_env()
    try:
        version = engine.version().get("Version", "?")
    finally:
        engine.close()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker": version,
    }


# -- the gateway under test --------------------------------------------------------------------


def report(results: dict[str, Any], tables: list[str], path: Path) -> None:
    """Print the machine, then `tables`; write `results` to `path` as JSON (every bench)."""
    m = results["machine"]
    print(
        f"\n{m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Docker {m['docker']} "
        f"({results['mode']} run)\n"
    )
    print("\n\n".join(tables))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def gateway(args: argparse.Namespace, runtime: Path, pool: int, **extra: str) -> Iterator[str]:
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
        "--pool-size",
        str(pool),
        "--max-sessions",
        str(max(args.density + 10, 40)),
        "--image",
        args.image,
        "--runtime-dir",
        str(runtime),
        "--log-level",
        "warning",
    ]
    if args.runtime:
        cmd += ["--runtime", args.runtime]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", value]
    with serving(cmd, port, pool, up_within=60) as url:
        yield url


@contextmanager
def serving(
    cmd: list[str],
    port: int,
    pool: int,
    *,
    up_within: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[str]:
    """Run a gateway command; yield its URL once it answers and `pool` kernels are warm.
    SIGTERM after (SIGKILL if it has not stopped within 60 s)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is None and _health(url) is not None, up_within, proc)
        wait_warm(url, pool)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.stderr:
            proc.stderr.close()


def _health(url: str) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = httpx.get(url + "/health", timeout=2).json()
        return result
    except (httpx.HTTPError, ValueError):
        return None


def wait_until(
    predicate: Callable[[], bool], seconds: float, proc: subprocess.Popen[str] | None = None
) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the gateway exited: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the gateway")
        time.sleep(0.05)


def wait_warm(url: str, n: int) -> None:
    def warm() -> bool:
        health = _health(url)
        return health is not None and health["pool"]["warm"] >= n

    wait_until(warm, 120)


# -- workloads ---------------------------------------------------------------------------------


class RawKernel:
    """Plain jupyter_client to a kernel container from the same image: the floor."""

    def __init__(self, args: argparse.Namespace, runtime: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.rt = RuntimeDir(runtime / "raw")
        self.rt.open()
        self.backend = DockerBackend(
            Settings(image=args.image, runtime_dir=runtime / "raw", runtime=args.runtime), self.rt
        )
        self.loop.run_until_complete(self.backend.start())
        self.storage = self.loop.run_until_complete(
            self.backend.prepare_storage(self.rt.new_workspace())
        )
        self.process = self.loop.run_until_complete(self.backend.launch(self.storage))
        # Under gVisor the sockets appear a few seconds after start; jupyter_client's
        # heartbeat check would call the kernel dead before that, so wait for them.
        prefix = self.process.connection["ip"]
        deadline = time.monotonic() + 60
        while not all(Path(f"{prefix}-{n}").exists() for n in range(1, 6)):
            if time.monotonic() > deadline:
                raise SystemExit("the raw kernel's sockets never appeared")
            time.sleep(0.05)
        self.client = BlockingKernelClient()
        self.client.load_connection_info(dict(self.process.connection))  # type: ignore[arg-type]
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def once(self) -> None:
        self.client.execute_interactive("1+1", timeout=30, output_hook=lambda msg: None)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.client.stop_channels()
        self.loop.run_until_complete(self.process.cleanup())
        self.loop.run_until_complete(self.backend.release_storage(self.storage))
        self.loop.run_until_complete(self.backend.close())
        self.rt.close()
        self.loop.close()


def read_until_done(response: httpx.Response) -> None:
    """Read an event stream up to its `done` event, with the client's own SSE decoder."""
    for event in iter_events(response.iter_bytes()):
        if event.event == "done":
            return
    raise RuntimeError("no done event")


def sse_round_trip(http: httpx.Client, session_id: str, code: str) -> None:
    with http.stream(
        "POST", f"/sessions/{session_id}/execute", json={"code": code}, headers=JSON_HEADERS
    ) as response:
        read_until_done(response)


class LeanSSE:
    """A minimal keep-alive HTTP/1.1 client for SSE round trips.

    It measures the gateway rather than a client library: httpx alone adds about
    half a millisecond per request here (its figure is reported too). It decodes no
    events: it only waits for the chunked body's end, which follows `done`.
    """

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host = host
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def execute(self, session_id: str, code: str) -> None:
        body = json.dumps({"code": code}).encode()
        self.sock.sendall(
            f"POST /sessions/{session_id}/execute HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # The body is chunked; the stream ends with the last chunk after `done`.
        while b"event: done" not in self.buffer or not self.buffer.endswith(b"0\r\n\r\n"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed")
            self.buffer += chunk
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()


def warm_round_trip(url: str, raw: RawKernel, n: int, pool: int) -> dict[str, Any]:
    """Gateway and raw round trips, interleaved in batches so drift hits both alike."""
    with httpx.Client(base_url=url, timeout=60) as http:
        sid = http.post("/sessions").json()["id"]
        wait_warm(url, pool)  # steady state: no kernel starting in the background
        lean = LeanSSE(url)
        raw_samples: list[float] = []
        gateway: list[float] = []
        try:
            timed(raw.once, 10, warmup=0)
            timed(lambda: lean.execute(sid, "1+1"), 10, warmup=0)
            batch = max(5, n // 10)
            for _ in range(max(1, n // batch)):
                raw_samples += timed(raw.once, batch, warmup=1)
                gateway += timed(lambda: lean.execute(sid, "1+1"), batch, warmup=1)
        finally:
            lean.close()
        with_httpx = timed(lambda: sse_round_trip(http, sid, "1+1"), n, warmup=10)
        http.delete(f"/sessions/{sid}")
    return {
        "raw": summary(raw_samples),
        "gateway": {**summary(gateway), "with_httpx_client": summary(with_httpx)},
    }


def session_acquisition(url: str, n: int, pool: int) -> dict[str, Any]:
    samples = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(n):
            wait_warm(url, pool)
            t = time.perf_counter()
            sid = http.post("/sessions").json()["id"]
            samples.append(time.perf_counter() - t)
            http.delete(f"/sessions/{sid}")
    return summary(samples)


def stateless_sequential(url: str, n: int, pool: int) -> dict[str, Any]:
    return summary(stateless_sequential_samples(url, n, pool))


def stateless_sequential_samples(url: str, n: int, pool: int) -> list[float]:
    samples = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(n):
            wait_warm(url, pool)
            t = time.perf_counter()
            with http.stream(
                "POST", "/execute", json={"code": "print(1)"}, headers=JSON_HEADERS
            ) as response:
                read_until_done(response)
            samples.append(time.perf_counter() - t)
    return samples


def stateless_throughput(
    url: str, seconds: float, concurrency: int, code: str = "print(1)"
) -> dict[str, Any]:
    """POST /execute (JSON answer) from `concurrency` keep-alive connections for `seconds`.

    The load runs on the same 2 cores as the gateway, so it is a lean asyncio HTTP/1.1
    client (a few hundred microseconds of CPU a request, where httpx costs milliseconds).
    """
    before = _health(url) or {"pool": {"kernels_started": 0}}
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"code": code}).encode()
    request = (
        f"POST /execute HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    counts = {"ok": 0, "refused": 0, "failed": 0}
    latencies: list[float] = []

    async def worker(stop: float) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.monotonic() < stop:
                t = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = 0
                retry = 1.0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                    elif name.lower() == b"retry-after":
                        retry = float(value)
                answer = await reader.readexactly(length)
                if status != 200:
                    counts["refused"] += 1
                    await asyncio.sleep(retry)
                elif json.loads(answer)["status"] != "ok":
                    counts["failed"] += 1
                else:
                    counts["ok"] += 1
                    latencies.append(time.perf_counter() - t)
        finally:
            writer.close()

    async def run() -> float:
        started = time.monotonic()
        await asyncio.gather(*(worker(started + seconds) for _ in range(concurrency)))
        return time.monotonic() - started

    elapsed = asyncio.run(run())
    after = _health(url) or {"pool": {"kernels_started": 0}}
    kernels = after["pool"]["kernels_started"] - before["pool"]["kernels_started"]
    return {
        "seconds": round(elapsed, 1),
        "concurrency": concurrency,
        "completed": counts["ok"],
        "refused_429_503": counts["refused"],
        "failed": counts["failed"],
        "requests_per_s": round(counts["ok"] / elapsed, 2),
        "kernel_starts_per_s": round(kernels / elapsed, 2),
        "latency": summary(latencies),
    }


FIRST_CHART = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
NUMPY = "import numpy as np; print(np.arange(10).sum())"


def stateless_chart(url: str, n: int) -> dict[str, Any]:
    """A stateless chart, request to PNG in hand (the JSON document)."""
    samples = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(n):
            t = time.perf_counter()
            response = http.post(
                "/execute",
                json={"code": FIRST_CHART},
                headers={**JSON_HEADERS, "Accept": "application/json"},
            )
            displays = [e for e in response.json()["events"] if e["event"] == "display"]
            if not displays or "image/png" not in displays[0]["data"]["data"]:
                raise RuntimeError(f"no chart: {response.text[:300]}")
            samples.append(time.perf_counter() - t)
    return summary(samples)


STATELESS_CONCURRENCY = (1, 8, 32)


def stateless_suite(args: argparse.Namespace, runtime: Path) -> dict[str, Any]:
    """POST /execute under load on the gateway's defaults (forked from fork servers), the
    machine's floor measured in the same run (bench/floor.py), and, unless skipped, the
    previous design (a warm container per request)."""
    seconds = args.throughput_seconds
    results: dict[str, Any] = {}
    print("the floor: a preloaded process forking a child per print(1)…", flush=True)
    results["floor"] = fork_floor(args.image, min(seconds, 10), list(STATELESS_CONCURRENCY))
    fork: dict[str, str] = {"stateless_mode": "fork"}
    if args.fork_servers is not None:
        fork["fork_servers"] = str(args.fork_servers)
    with gateway(args, runtime / "fork", 0, **fork) as url:
        wanted = (_health(url) or {}).get("fork_servers", {}).get("target", 1)
        wait_until(
            lambda: (_health(url) or {}).get("fork_servers", {}).get("idle", 0) >= wanted, 120
        )
        out: dict[str, Any] = {"fork_servers": wanted}
        for concurrency in STATELESS_CONCURRENCY:
            print(f"stateless (fork) print(1) at concurrency {concurrency}…", flush=True)
            out[f"print_c{concurrency}"] = stateless_throughput(url, seconds, concurrency)
            floor = results["floor"][concurrency]["forks_per_s"]
            out[f"print_c{concurrency}"]["ratio_to_floor"] = round(
                out[f"print_c{concurrency}"]["requests_per_s"] / floor, 3
            )
        print("stateless (fork) numpy at concurrency 8…", flush=True)
        out["numpy_c8"] = stateless_throughput(url, seconds, 8, NUMPY)
        print("stateless (fork) chart…", flush=True)
        out["chart"] = stateless_chart(url, max(5, args.iterations // 15))
        results["fork"] = out
    if not args.skip_container_stateless:
        container = {"stateless_mode": "container", "max_stateless": "16"}
        with gateway(args, runtime / "container", 4, **container) as url:
            print("stateless (container per request) at concurrency 8…", flush=True)
            results["container"] = {"print_c8": stateless_throughput(url, min(seconds, 30), 8)}
    return results


def stateless_table(r: dict[str, Any]) -> str:
    lines = [
        f"{'stateless POST /execute (defaults)':<44}  {'req/s':>7}  {'floor':>7}  {'ratio':>6}  "
        f"{'p50 ms':>8}  {'p99 ms':>8}  {'ok':>6}  {'failed':>6}  {'refused':>7}",
        "-" * 114,
    ]
    rows = [
        (f"fork, print(1), concurrency {c}", r["fork"][f"print_c{c}"], r["floor"][c])
        for c in STATELESS_CONCURRENCY
    ]
    rows.append(("fork, numpy sum, concurrency 8", r["fork"]["numpy_c8"], None))
    if "container" in r:
        rows.append(
            ("container per request (before), concurrency 8", r["container"]["print_c8"], None)
        )
    for name, t, floor in rows:
        lat = t["latency"]
        floor_rate = f"{floor['forks_per_s']:>7}" if floor else f"{'':>7}"
        ratio = f"{t['ratio_to_floor']:>6.2f}" if "ratio_to_floor" in t else f"{'':>6}"
        lines.append(
            f"{name:<44}  {t['requests_per_s']:>7}  {floor_rate}  {ratio}  {lat['p50_ms']:>8.1f}  "
            f"{lat['p99_ms']:>8.1f}  {t['completed']:>6}  {t['failed']:>6}  "
            f"{t['refused_429_503']:>7}"
        )
    chart = r["fork"]["chart"]
    lines.append(
        f"fork, a chart (plt.plot, plt.show -> PNG), sequential: p50 {chart['p50_ms']:.1f} ms, "
        f"p99 {chart['p99_ms']:.1f} ms"
    )
    lines.append(
        f"floor: a preloaded process of the image forking a child per print(1), that many in "
        f"flight; {r['fork']['fork_servers']} fork servers (the default)"
    )
    return "\n".join(lines)


def first_chart(url: str, n: int, pool: int) -> dict[str, Any]:
    return summary(first_chart_samples(url, n, pool))


def first_chart_samples(url: str, n: int, pool: int) -> list[float]:
    samples = []
    with Client(url) as client:
        for _ in range(n):
            wait_warm(url, pool)
            with client.session() as session:
                t = time.perf_counter()
                for event in session.stream(FIRST_CHART):
                    if isinstance(event, Display) and event.png:
                        samples.append(time.perf_counter() - t)
                        break
                else:
                    raise RuntimeError("no chart")
    return samples


LAG_CELL = (
    "import time\n"
    "for _ in range({n}):\n"
    "    print(repr(time.time()), flush=True)\n"
    "    time.sleep(0.1)\n"
)


def streaming_lag(url: str, lines: int) -> dict[str, Any]:
    return streaming_lag_with(url, lines)


def streaming_lag_with(url: str, lines: int, token: str | None = None) -> dict[str, Any]:
    """How late each line printed every 100 ms arrives (the kernel's clock is the host's)."""
    lags = []
    with Client(url, token=token) as client, client.session() as session:
        for event in session.stream(LAG_CELL.format(n=lines)):
            now = time.time()
            if isinstance(event, Stdout):
                for line in event.text.split():
                    lags.append(now - float(line))
            elif isinstance(event, Done):
                break
    return summary(lags)


def cold_start(args: argparse.Namespace, runtime: Path, n: int) -> dict[str, Any]:
    """Container create -> kernel answers (before any preloading)."""
    return cold_starts(args.image, runtime / "cold", n, runtime=args.runtime)


def cold_starts(
    image: str, folder: Path, n: int, *, runtime: str | None = None, language: str | None = None
) -> dict[str, Any]:
    """Container create -> the kernel of `language` (None: Python) answers, on the backend
    itself, `n` times; storage is prepared off the clock."""
    return summary(cold_start_samples(image, folder, n, runtime=runtime, language=language))


def cold_start_samples(
    image: str, folder: Path, n: int, *, runtime: str | None = None, language: str | None = None
) -> list[float]:

    async def measure() -> list[float]:
        rt = RuntimeDir(folder)
        rt.open()
        backend = DockerBackend(Settings(image=image, runtime_dir=folder, runtime=runtime), rt)
        await backend.start()
        import zmq.asyncio

        context = zmq.asyncio.Context()
        samples = []
        try:
            chosen = backend.languages.get_or_raise(language)
            for _ in range(n):
                storage = await backend.prepare_storage(rt.new_workspace())  # done off the clock
                t = time.perf_counter()
                kernel = Kernel(await backend.launch(storage, chosen), context)
                await kernel.wait_ready(120)
                samples.append(time.perf_counter() - t)
                await kernel.close()
                await backend.release_storage(storage)
        finally:
            await backend.close()
            context.destroy(linger=0)
            rt.close()
        return samples

    return asyncio.run(measure())


def container_memory_mib(instance: str) -> list[float]:
    engine = docker.from_env()
    try:
        containers = engine.containers.list(
            filters={"label": f"io.kernel-gateway.instance={instance}"}
        )
        out = []
        for c in containers:
            stats: dict[str, Any] = c.stats(stream=False, one_shot=True)  # type: ignore[assignment]
            usage = stats["memory_stats"].get("usage", 0)
            cache = stats["memory_stats"].get("stats", {}).get("cache", 0)
            out.append((usage - cache) / 2**20)
        return out
    finally:
        engine.close()


def _round_trip_of(http: httpx.Client, session_id: str) -> Callable[[], None]:
    return lambda: sse_round_trip(http, session_id, "1+1")


def density(url: str, sessions: int, n: int, single_p50_ms: float) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=120) as http:
        ids: list[str] = []
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda _: http.post("/sessions").json()["id"], range(sessions)))
        for sid in ids:  # every kernel has run something: a realistic idle session
            sse_round_trip(http, sid, "x = 1")
        wait_warm(url, 1)
        instance = http.get("/health").json()["instance"]
        memory = container_memory_mib(instance)
        per_session = [
            statistics.fmean(timed(_round_trip_of(http, sid), 5, 1))
            for sid in ids[:: max(1, len(ids) // 20)]
        ]
        lean = LeanSSE(url)
        try:
            samples = timed(lambda: lean.execute(ids[0], "1+1"), n, warmup=5)
        finally:
            lean.close()
        for sid in ids:
            http.delete(f"/sessions/{sid}")
    stats = summary(samples)
    return {
        "sessions": sessions,
        "idle_container_memory_mib": {
            "mean": round(statistics.fmean(memory), 1) if memory else None,
            "max": round(max(memory), 1) if memory else None,
            "containers": len(memory),
        },
        "warm_1plus1": stats,
        "mean_across_sessions_ms": round(statistics.fmean(per_session) * 1000, 3),
        "ratio_to_single_session_p50": round(stats["p50_ms"] / single_p50_ms, 2),
    }


# -- Jupyter Kernel Gateway, optionally ---------------------------------------------------------

JKG_CLIENT = r"""
import json, statistics, sys, time, uuid, urllib.request
import websocket
base = sys.argv[1]; n = int(sys.argv[2])
req = urllib.request.Request(base + "/api/kernels", data=b"{}", method="POST",
                             headers={"Content-Type": "application/json"})
kernel = json.load(urllib.request.urlopen(req))["id"]
ws = websocket.create_connection(f"ws{base[4:]}/api/kernels/{kernel}/channels")
def run(code):
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request",
        "username": "", "session": "bench", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False}}))
    while True:
        m = json.loads(ws.recv())
        if (m.get("parent_header", {}).get("msg_id") == msg_id and m["msg_type"] == "status"
                and m["content"]["execution_state"] == "idle"):
            return
for _ in range(10): run("1+1")
out = []
for _ in range(n):
    t = time.perf_counter(); run("1+1"); out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def jupyter_kernel_gateway(n: int, workdir: Path) -> dict[str, Any]:
    venv = workdir / "jkg-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "jupyter_kernel_gateway", "ipykernel", "websocket-client"], check=True)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(venv / "bin" / "jupyter"),
            "kernelgateway",
            f"--KernelGatewayApp.port={port}",
            "--KernelGatewayApp.ip=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _jkg_up(base), 60)
        script = workdir / "jkg_client.py"
        script.write_text(JKG_CLIENT)
        result = subprocess.run(
            [str(venv / "bin" / "python"), str(script), base, str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        return {"warm_1plus1": summary(json.loads(result.stdout)), "kernels": "local processes"}
    finally:
        proc.terminate()
        proc.wait(30)


def _jkg_up(base: str) -> bool:
    try:
        return httpx.get(base + "/api", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# -- report ------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    r = results
    raw, warm = r["raw_jupyter_client"], r["warm_round_trip"]
    rows = [
        (
            "warm 1+1, raw jupyter_client (floor)",
            f"{raw['p50_ms']:.2f}",
            f"{raw['p99_ms']:.2f}",
            "",
        ),
        (
            "warm 1+1 through HTTP + SSE",
            f"{warm['p50_ms']:.2f}",
            f"{warm['p99_ms']:.2f}",
            f"p50 {r['ratios']['warm_p50_vs_raw']}x raw (≤1.3), "
            f"p99 {r['ratios']['warm_p99_vs_raw']}x (≤2)",
        ),
        (
            "  the same, measured with the httpx client",
            f"{warm['with_httpx_client']['p50_ms']:.2f}",
            f"{warm['with_httpx_client']['p99_ms']:.2f}",
            "client-library cost included",
        ),
        (
            "POST /sessions (warm pool)",
            f"{r['session_acquisition']['p50_ms']:.2f}",
            f"{r['session_acquisition']['p99_ms']:.2f}",
            "target p50 ≤ 20 ms",
        ),
        (
            "POST /execute print(1), sequential",
            f"{r['stateless_sequential']['p50_ms']:.2f}",
            f"{r['stateless_sequential']['p99_ms']:.2f}",
            "target p50 ≤ 30 ms",
        ),
        (
            "first chart in a fresh session",
            f"{r['first_chart']['p50_ms']:.2f}",
            f"{r['first_chart']['p99_ms']:.2f}",
            "target p50 ≤ 150 ms",
        ),
        (
            "streaming lag (print → client)",
            f"{r['streaming_lag']['p50_ms']:.2f}",
            f"{r['streaming_lag']['p99_ms']:.2f}",
            "target p50 ≤ 20 ms",
        ),
        (
            "cold start: container → kernel ready",
            f"{r['cold_start']['p50_ms']:.0f}",
            f"{r['cold_start']['p99_ms']:.0f}",
            "target p50 ≤ 800 ms",
        ),
    ]
    d = r.get("density")
    if d:
        rows.append(
            (
                f"warm 1+1 with {d['sessions']} sessions open",
                f"{d['warm_1plus1']['p50_ms']:.2f}",
                f"{d['warm_1plus1']['p99_ms']:.2f}",
                f"{d['ratio_to_single_session_p50']}x single (≤1.5)",
            )
        )
    if "jupyter_kernel_gateway" in r:
        j = r["jupyter_kernel_gateway"]["warm_1plus1"]
        rows.append(
            (
                "Jupyter Kernel Gateway 1+1 (local kernel)",
                f"{j['p50_ms']:.2f}",
                f"{j['p99_ms']:.2f}",
                "same workload, its websocket API",
            )
        )
    width = max(len(row[0]) for row in rows)
    lines = [f"{'measure':<{width}}  {'p50 ms':>9}  {'p99 ms':>9}  note", "-" * (width + 40)]
    lines += [f"{a:<{width}}  {b:>9}  {c:>9}  {d_}" for a, b, c, d_ in rows]
    t = r["stateless_throughput"]
    lines.append(
        f"stateless at concurrency {t['concurrency']} for {t['seconds']} s: "
        f"{t['requests_per_s']} req/s ({t['completed']} ok, {t['refused_429_503']} refused), "
        f"kernel starts {t['kernel_starts_per_s']}/s"
    )
    if d:
        m = d["idle_container_memory_mib"]
        lines.append(
            f"idle session memory (container cgroup): mean {m['mean']} MiB, "
            f"max {m['max']} MiB over {m['containers']} containers"
        )
    return "\n".join(lines)


def run_gateway_workloads(
    args: argparse.Namespace, results: dict[str, Any], url: str, n: int, small: int, pool: int
) -> None:
    print("session acquisition…", flush=True)
    results["session_acquisition"] = session_acquisition(url, small, pool)
    print("stateless…", flush=True)
    results["stateless_sequential"] = stateless_sequential(url, small, pool)
    results["stateless_throughput"] = stateless_throughput(url, args.throughput_seconds, 8)
    wait_warm(url, pool)
    print("first chart…", flush=True)
    results["first_chart"] = first_chart(url, small, pool)
    print("streaming lag…", flush=True)
    results["streaming_lag"] = streaming_lag(url, 30 if not args.smoke else 5)
    if args.skip_density:
        return
    print(f"density ({args.density} sessions)…", flush=True)
    results["density"] = density(url, args.density, n // 3, results["warm_round_trip"]["p50_ms"])


def stateless_only(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"machine": machine(), "mode": "stateless-only"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    try:
        results["stateless"] = stateless_suite(args, runtime)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    print()
    print(stateless_table(results["stateless"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def image_only(args: argparse.Namespace) -> int:
    """Cold start and first chart of `--image`: the figures a kernel image changes."""
    n = max(3, args.iterations // 15)
    results: dict[str, Any] = {"machine": machine(), "image": args.image, "mode": "image-only"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    try:
        print("cold start…", flush=True)
        results["cold_start"] = cold_start(args, runtime, n)
        with gateway(args, runtime / "gw", 2) as url:
            print("first chart…", flush=True)
            results["first_chart"] = first_chart(url, n, 2)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    for name in ("cold_start", "first_chart"):
        r = results[name]
        print(f"{args.image}  {name:<12} p50 {r['p50_ms']:8.1f} ms  p90 {r['p90_ms']:8.1f} ms")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run to check the bench works")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--density", type=int, default=100, help="sessions for the density run")
    parser.add_argument("--throughput-seconds", type=float, default=30)
    parser.add_argument("--image", default=os.environ.get("KG_IMAGE", DEFAULT_IMAGE))
    parser.add_argument(
        "--compare-jkg", action="store_true", help="also install and measure Jupyter Kernel Gateway"
    )
    parser.add_argument("--runtime", help="OCI runtime for kernel containers, e.g. runsc")
    parser.add_argument("--skip-density", action="store_true", help="leave out the density run")
    parser.add_argument(
        "--image-only",
        action="store_true",
        help="only what the image decides: cold start and first chart (to compare images)",
    )
    parser.add_argument(
        "--stateless-only",
        action="store_true",
        help="only POST /execute under load (fork servers, and the container-per-request design)",
    )
    parser.add_argument(
        "--fork-servers",
        type=int,
        help="fork servers for the stateless run (default: the gateway's)",
    )
    parser.add_argument(
        "--skip-container-stateless",
        action="store_true",
        help="leave out the container-per-request design from the stateless run",
    )
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="a git revision or an image tag measured beside the current tree/image in one run "
        "(bench/ab.py)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "latest.json")
    args = parser.parse_args()
    if args.compare:
        sys.path.insert(0, str(ROOT.parent))  # `python bench/run.py` puts only bench/ there
        from bench import ab

        smoke = ["--smoke"] if args.smoke else []
        return ab.main(
            ["--base", args.compare, "--image", args.image, "--json", str(args.json), *smoke]
        )
    if args.smoke:
        args.iterations, args.density, args.throughput_seconds = 10, 2, 0.5
        args.fork_servers, args.skip_container_stateless = 2, True
    if args.image_only:
        return image_only(args)
    if args.stateless_only:
        return stateless_only(args)
    n = args.iterations
    small = 2 if args.smoke else max(5, n // 15)
    pool = 4

    results: dict[str, Any] = {
        "machine": machine(),
        "mode": "smoke" if args.smoke else "full",
        "runtime": args.runtime or "runc",
    }
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    try:
        print("cold start…", flush=True)
        results["cold_start"] = cold_start(args, runtime, small)
        raw = RawKernel(args, runtime)
        try:
            with gateway(args, runtime / "gw", pool) as url:
                print("warm round trip: gateway and raw jupyter_client, interleaved…", flush=True)
                trips = warm_round_trip(url, raw, n, pool)
                results["raw_jupyter_client"] = trips["raw"]
                results["warm_round_trip"] = trips["gateway"]
                raw.close()
                run_gateway_workloads(args, results, url, n, small, pool)
        finally:
            raw.close()
        print("stateless under load…", flush=True)
        results["stateless"] = stateless_suite(args, runtime)
        if args.compare_jkg:
            print("Jupyter Kernel Gateway…", flush=True)
            try:
                results["jupyter_kernel_gateway"] = jupyter_kernel_gateway(n, runtime)
            except (subprocess.CalledProcessError, SystemExit) as exc:
                print(f"could not measure Jupyter Kernel Gateway: {exc}", flush=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    raw_rt, warm = results["raw_jupyter_client"], results["warm_round_trip"]
    results["ratios"] = {
        "warm_p50_vs_raw": round(warm["p50_ms"] / raw_rt["p50_ms"], 2),
        "warm_p99_vs_raw": round(warm["p99_ms"] / raw_rt["p99_ms"], 2),
    }
    m = results["machine"]
    print(
        f"\n{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Docker {m['docker']} ({results['runtime']}), Python {m['python']} "
        f"({results['mode']} run)\n"
    )
    print(table(results))
    print()
    print(stateless_table(results["stateless"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

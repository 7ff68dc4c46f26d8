"""What every cell costs inside a kernel besides the user's code, one thing at a time.

    python -m bench.cell_work                 # 600 cells per variant, in the kernel image
    python -m bench.cell_work --smoke         # 40 cells each, to check the bench works

In one container of the kernel image, kernels are started side by side, each differing
from the one before in one thing, and driven with plain jupyter_client from inside the
container (no gateway, no Docker in the path); cells of `pass` alternate between them in
rounds so drift hits all alike. The variants:

- `ipykernel`: ipykernel as Jupyter runs it, IPython's history in a SQLite file written by
  a background thread (IPython's default);
- `history in memory`: the same with `HistoryManager.hist_file=:memory:` (no file, no
  thread; `%history`, `In` and `Out` work as before);
- `history off`: `HistoryManager.enabled=False`;
- `start-up code`: the gateway's in-kernel start-up code (kernel_startup.py: output
  routing, outcome log, stdio and chart habits), with IPython's history in a file, and as
  the gateway runs it (history in memory);
- `+ pyplot`: that, after `import matplotlib.pyplot` (the inline backend's post-execute
  hook then runs after every cell);
- `+ preload`: that, after the gateway's preload (numpy, pandas, matplotlib, a first chart).

Prints the p50 round trip of each and what it costs against the variant it differs from
in one thing; writes `bench/results/cell_work.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from kernel_gateway.kernels.backends.base import in_kernel_source
from kernel_gateway.kernels.pools.warm import preload_code
from kernel_gateway.settings import DEFAULT_IMAGE, Settings

try:
    from bench.floor import python_in_image
except ModuleNotFoundError:  # run as `python bench/cell_work.py`
    from floor import python_in_image  # type: ignore[import-not-found,no-redef]

ROOT = Path(__file__).resolve().parent
PROGRAM = r"""
import json, os, statistics, subprocess, sys, time
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

n, preload, variants = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
kernels = []
for i, (name, how, args, setup) in enumerate(variants):
    folder = f"/tmp/k{i}"
    os.makedirs(folder)
    path, info = write_connection_file(f"{folder}/kernel.json", transport="ipc", ip=f"{folder}/k")
    program = ["-m", "ipykernel_launcher"] if how == "ipykernel" else ["/k/startup.py"]
    env = {**os.environ, "HOME": folder}
    log = open(f"{folder}/log", "w")
    proc = subprocess.Popen([sys.executable, *program, "-f", path, *args], env=env,
                            stdout=log, stderr=log)
    client = BlockingKernelClient()
    client.load_connection_info(info)
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
    except RuntimeError:
        raise SystemExit(f"kernel {name!r} died: " + open(f"{folder}/log").read()[-3000:])
    for code in setup:
        client.execute_interactive(preload if code == "PRELOAD" else code, timeout=120,
                                   output_hook=lambda m: None)
    kernels.append((name, proc, client))
def once(client):
    t = time.perf_counter()
    client.execute_interactive("pass", timeout=30, output_hook=lambda m: None)
    return time.perf_counter() - t
samples = {name: [] for name, _, _ in kernels}
for _, _, client in kernels:
    for _ in range(30):
        once(client)
for _ in range(max(1, n // 20)):
    for name, _, client in kernels:
        samples[name] += [once(client) for _ in range(20)]
for _, proc, client in kernels:
    client.stop_channels()
    proc.kill()
print(json.dumps({name: sorted(v) for name, v in samples.items()}))
"""

MEMORY = ["--HistoryManager.hist_file=:memory:"]
FILE = ["--HistoryManager.hist_file=/tmp/history.sqlite"]
OFF = ["--HistoryManager.enabled=False"]


VARIANTS: list[tuple[str, str, list[str], list[str], str | None]] = [
    # (name, how started, its arguments, cells run first, the variant it differs from)
    ("ipykernel, history in a SQLite file", "ipykernel", [], [], None),
    (
        "ipykernel, history in memory",
        "ipykernel",
        MEMORY,
        [],
        "ipykernel, history in a SQLite file",
    ),
    ("ipykernel, history off", "ipykernel", OFF, [], "ipykernel, history in memory"),
    (
        "start-up code, history in a SQLite file",
        "startup",
        FILE,
        [],
        "ipykernel, history in a SQLite file",
    ),
    ("start-up code (the gateway's kernels)", "startup", [], [], "ipykernel, history in memory"),
    (
        "  + matplotlib.pyplot imported",
        "startup",
        [],
        ["import matplotlib.pyplot"],
        "start-up code (the gateway's kernels)",
    ),
    ("  + the gateway's preload", "startup", [], ["PRELOAD"], "  + matplotlib.pyplot imported"),
]


def measure(image: str, n: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="kg-cells-") as folder:
        (Path(folder) / "startup.py").write_bytes(in_kernel_source("kernel_startup.py"))
        os.chmod(folder, 0o755)  # the image's user reads it
        os.chmod(Path(folder) / "startup.py", 0o644)
        samples: dict[str, list[float]] = python_in_image(
            image,
            PROGRAM,
            [str(n), preload_code(Settings().preload_list), json.dumps([v[:4] for v in VARIANTS])],
            docker_args=["--volume", f"{folder}:/k:ro"],
        )
    return samples


def p50_ms(values: list[float]) -> float:
    return round(sorted(values)[len(values) // 2] * 1000, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=os.environ.get("KG_IMAGE", DEFAULT_IMAGE))
    parser.add_argument("--cells", type=int, default=600, help="cells per variant")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "cell_work.json")
    parser.add_argument("--smoke", action="store_true", help="tiny run, to check the bench works")
    args = parser.parse_args()
    if args.smoke:
        args.cells = 40
    samples = measure(args.image, args.cells)
    p50 = {name: p50_ms(values) for name, values in samples.items()}
    print(f"\n{'one cell of `pass`, round trip in the image':<44}  {'p50 ms':>8}  {'its cost':>9}")
    for name, _, _, _, base in VARIANTS:
        cost = f"{p50[name] - p50[base]:+.3f}" if base else ""
        print(f"{name:<44}  {p50[name]:>8.3f}  {cost:>9}  {'vs ' + base.strip() if base else ''}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"image": args.image, "p50_ms": p50}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark runs (smoke mode). Timing is reported by the bench, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.backends import IMAGE, require_docker, require_languages

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_run_writes_every_figure(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warm 1+1 through HTTP + SSE" in result.stdout
    figures = json.loads(out.read_text())
    for key in (
        "raw_jupyter_client",
        "warm_round_trip",
        "session_acquisition",
        "stateless_sequential",
        "stateless_throughput",
        "first_chart",
        "streaming_lag",
        "cold_start",
        "density",
        "ratios",
        "machine",
        "stateless",
    ):
        assert key in figures, key
    assert figures["warm_round_trip"]["n"] == 10
    forked = figures["stateless"]["fork"]
    for key in ("print_c1", "print_c8", "print_c32", "numpy_c8"):
        assert forked[key]["completed"] > 0 and forked[key]["failed"] == 0, (key, forked[key])
    for concurrency in ("1", "8", "32"):  # the floor, measured in the same run, and the ratio
        assert figures["stateless"]["floor"][concurrency]["forks_per_s"] > 0
        assert forked[f"print_c{concurrency}"]["ratio_to_floor"] > 0
    assert "fork, print(1), concurrency 8" in result.stdout


def test_bench_image_only_measures_the_given_image(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "image.json"
    result = run_main_bench(out, "--image-only")
    figures = json.loads(out.read_text())
    assert figures["image"] == IMAGE
    assert figures["cold_start"]["n"] == 3 and figures["first_chart"]["n"] == 3
    assert f"{IMAGE}  first_chart" in result.stdout


def test_bench_compare_measures_a_baseline_image_beside_the_current_one(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "ab.json"
    result = run_main_bench(out, "--compare", IMAGE)
    figures = json.loads(out.read_text())
    assert figures["images"] == {"base": IMAGE, "tree": IMAGE}
    for key in ("raw_round_trip", "warm_round_trip", "stateless_sequential", "first_chart"):
        assert figures[key]["base"]["n"] > 0 and figures[key]["tree"]["n"] > 0, key
    assert figures["cold_start"]["tree"]["n"] > 0
    for key in ("stateless_c1", "stateless_c8"):
        assert figures[key]["tree"]["completed"] > 0 and figures[key]["base"]["failed"] == 0
    assert "| stateless `print(1)`, concurrency 8 (req/s) |" in result.stdout


def test_bench_cell_work_measures_each_variant(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "cells.json"
    result = run_bench("bench.cell_work", out)
    figures = json.loads(out.read_text())["p50_ms"]
    assert len(figures) == 7 and all(value > 0 for value in figures.values())
    assert "ipykernel, history in memory" in result.stdout


def test_bench_languages_measures_the_languages_asked_for(tmp_path: Path) -> None:
    """Three of the six (each language goes through the same code; R and Python draw a
    chart, bash is the smallest image): the full run measures all six."""
    require_languages("r", "bash")
    out = tmp_path / "languages.json"
    result = run_bench("bench.languages", out, "--languages", "python,r,bash", timeout=900)
    figures = json.loads(out.read_text())
    assert list(figures["languages"]) == ["python", "r", "bash"]
    for name, entry in figures["languages"].items():
        for key in ("cold_start", "warm_first_result", "round_trip"):
            assert entry[key]["n"] > 0, (name, key)
    assert figures["languages"]["r"]["first_chart"]["n"] > 0
    assert figures["images"]["bash"]["added_mb"] < figures["images"]["r"]["added_mb"]
    assert "| r |" in result.stdout


def test_bench_e2b_measures_the_sdk_beside_our_client(tmp_path: Path) -> None:
    pytest.importorskip("e2b_code_interpreter")
    require_docker()
    out = tmp_path / "e2b.json"
    result = run_bench("bench.e2b", out)
    figures = json.loads(out.read_text())
    for key in ("first_result", "round_trip"):
        for client in ("e2b_sdk", "own_client"):
            assert figures[key][client]["n"] > 0, (key, client)
    assert "| create → first result |" in result.stdout


def test_bench_egress_measures_a_proxied_request_beside_a_direct_one(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "egress.json"
    result = run_bench("bench.egress", out)
    figures = json.loads(out.read_text())
    for way in ("direct", "proxied"):
        assert figures[way]["p50_ms"] > 0 and figures[way]["download_mib_s"] > 0, figures
    assert figures["proxy_memory_mib"] > 0
    assert "| HTTP GET, new connection" in result.stdout


def test_bench_secrets_measures_interception_beside_a_tunnel(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "interception.json"
    result = run_bench("bench.interception", out)
    figures = json.loads(out.read_text())
    for way in ("tunnel", "intercepted"):
        assert figures[way]["p50_ms"] > 0 and figures[way]["requests"] == 10, figures
    assert "| HTTPS GET, new connection" in result.stdout


def test_bench_hibernation_measures_both_sessions_and_the_memory(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "hibernation.json"
    result = run_bench("bench.hibernation", out)
    figures = json.loads(out.read_text())
    for kind in ("small", "dataframe"):
        for key in ("hibernate", "resume", "first_result"):
            assert figures[kind][key]["n"] > 0, (kind, key)
    assert figures["dataframe"]["snapshot_bytes"] > 100_000_000
    memory = figures["memory"]
    assert memory["sessions"] == 2 and memory["running_containers"] >= 2
    assert "| 100 MB DataFrame |" in result.stdout


def run_main_bench(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python bench/run.py <args> --smoke` on the test image, its figures written to `out`."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), *args, "--smoke"]
        + ["--image", IMAGE, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def run_bench(
    module: str, out: Path, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m <module> --smoke <args>` on the test image, its figures written to `out`."""
    result = subprocess.run(
        [sys.executable, "-m", module, "--smoke", *args, "--image", IMAGE, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_bench_templates_measures_a_template_beside_the_default_image(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "templates.json"
    result = run_bench("bench.templates", out)
    figures = json.loads(out.read_text())
    assert figures["build_s"]["uncached"] > 0 and figures["build_s"]["cached"] > 0
    for image in ("default", "template"):
        assert figures["create_first_result"][image]["n"] == 2, image
    assert figures["template_over_default_p50"] > 0
    assert "| create → first result p50 |" in result.stdout


def test_bench_snapshots_measures_forks_and_sessions_from_snapshots(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "snapshots.json"
    result = run_bench("bench.snapshots", out)
    figures = json.loads(out.read_text())
    for kind in ("small", "dataframe"):
        for key in ("snapshot", "from_snapshot", "from_snapshot_to_first_result", "fork", "fork_4"):
            assert figures[kind][key]["n"] > 0, (kind, key)
    assert figures["dataframe"]["snapshot_bytes"] > 100_000_000
    assert "| 100 MB DataFrame |" in result.stdout


def test_bench_keys_measures_a_canary_beside_another_keys_flood(tmp_path: Path) -> None:
    require_docker()
    out = tmp_path / "keys.json"
    result = run_bench("bench.keys", out)
    figures = json.loads(out.read_text())
    for phase in ("canary_alone", "canary_beside_flood"):
        assert figures[phase]["n"] > 0 and figures[phase]["p99_ms"] > 0, figures
    assert figures["flood"]["completed_per_s"] > 0 and figures["p99_ratio"] > 0
    assert "| canary `1+1` (ms) | alone | beside the flood |" in result.stdout

"""What a secret costs: an HTTPS request through the egress relay's interception (a session
that uses a secret) next to the same request through a plain tunnel (a session without),
in one run, on one gateway.

    python -m bench.interception            # 200 requests each way, interleaved in 4 rounds
    python -m bench.interception --smoke    # a tiny run, to check the bench works

An HTTPS upstream (the kernel image's Python serving a small file, a certificate of a CA
made for the run) runs on an internal Docker network; nothing leaves the machine. Both
sessions may reach `bench.test`; one names a secret whose header goes to it. Each request
opens its own connection and TLS session (as most scripts' requests do): the interception's
cost is one more TLS handshake (the relay's to the upstream) and the relay reading the
request and answer heads. The target (issue 39): under 5 ms added at p50.

Asserts nothing; prints a table and writes bench/results/interception.json.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker
import docker.types
import httpx

from bench.run import ROOT, free_port, machine, report, serving
from kernel_gateway.settings import DEFAULT_IMAGE

SUBNET = "203.0.114.0/24"
SERVE = """
import http.server, ssl
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"x" * 1024
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/srv/cert.pem", "/srv/key.pem")
httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
"""
MEASURE = """
import json, os, ssl, time, urllib.request
cafile = {cafile!r} or os.environ.get("SSL_CERT_FILE")
context = ssl.create_default_context(cafile=cafile)
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
def get():
    with opener.open("https://bench.test/small", timeout=30) as answer:
        return len(answer.read())
deadline = time.monotonic() + 90
while True:
    try:
        get()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
times = []
for _ in range({n}):
    t = time.perf_counter()
    get()
    times.append(round((time.perf_counter() - t) * 1000, 3))
print(json.dumps(times))
"""


def make_tls(folder: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-days", "2", "-subj", "/CN=bench CA", "-keyout", "ca.key", "-out", "ca.pem",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash")  # fmt: skip
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-subj", "/CN=bench.test", "-keyout", "key.pem", "-out", "cert.csr")  # fmt: skip
    (folder / "ext.cnf").write_text(
        "subjectAltName=DNS:bench.test\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\nbasicConstraints=critical,CA:FALSE\n"
    )
    openssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", "cert.pem", "-extfile", "ext.cnf")  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--requests", type=int, default=200, help="each way, in all rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the kernel image")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "interception.json")
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    n = 10 if args.smoke else max(1, args.requests // rounds)
    client = docker.from_env()
    tag = secrets.token_hex(3)
    folder = Path(tempfile.mkdtemp(prefix="kg-bench-secrets-"))
    make_tls(folder)
    (folder / "serve.py").write_text(SERVE)
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    key = folder / "secrets.key"
    key.write_bytes(secrets.token_bytes(32))
    key.chmod(0o600)
    net = f"kg-bench-secrets-{tag}"
    network = client.networks.create(
        net,
        internal=True,
        ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=SUBNET)]),
    )
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-secrets-gw-"))
    upstream = None
    try:
        upstream = client.containers.run(
            args.image,
            ["/opt/venv/bin/python", "/srv/serve.py"],
            name=f"kg-bench-secrets-up-{tag}",
            user="0:0",
            detach=True,
            volumes={str(folder): {"bind": "/srv", "mode": "ro"}},
            network=net,
            networking_config={net: client.api.create_endpoint_config(aliases=["bench.test"])},
        )
        port = free_port()
        cmd = [
            sys.executable, "-m", "kernel_gateway", "serve", "--backend", "docker",
            "--port", str(port), "--image", args.image, "--pool-size", "2",
            "--runtime-dir", str(runtime), "--log-level", "warning",
            "--egress-allow", "bench.test", "--egress-networks", net,
            "--secrets-key-file", str(key), "--egress-ca-file", str(folder / "ca.pem"),
        ]  # fmt: skip
        with serving(cmd, port, 2, up_within=90) as url, httpx.Client(base_url=url) as http:
            http.post(
                "/secrets",
                json={
                    "name": "BENCH",
                    "value": secrets.token_hex(16),
                    "domains": ["bench.test"],
                    "header": "Authorization",
                    "format": "Bearer {value}",
                },
            ).raise_for_status()
            network_policy = {"allow": ["bench.test"]}
            tunnel = http.post("/sessions", json={"network": network_policy}, timeout=120)
            opened = http.post(
                "/sessions", json={"network": network_policy, "secrets": ["BENCH"]}, timeout=120
            )
            tunnel.raise_for_status()
            opened.raise_for_status()
            ca = (folder / "ca.pem").read_bytes()
            http.put(f"/sessions/{tunnel.json()['id']}/files/ca.pem", content=ca).raise_for_status()
            times: dict[str, list[float]] = {"tunnel": [], "intercepted": []}
            for _ in range(rounds):
                for name, sid, cafile in (
                    ("tunnel", tunnel.json()["id"], "ca.pem"),
                    ("intercepted", opened.json()["id"], ""),
                ):
                    code = MEASURE.format(n=n, cafile=cafile)
                    answer = http.post(
                        f"/sessions/{sid}/execute",
                        json={"code": code, "timeout": 600},
                        headers={"Accept": "application/json"},
                        timeout=700,
                    ).json()
                    if answer.get("status") != "ok":
                        raise SystemExit(f"the {name} run failed: {json.dumps(answer)[:3000]}")
                    times[name] += json.loads(answer["stdout"].strip().splitlines()[-1])
    finally:
        if upstream is not None:
            upstream.remove(force=True)
        network.reload()
        for attached in network.containers:
            network.disconnect(attached, force=True)
        network.remove()
        client.close()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
    for name, values in times.items():
        results[name] = {
            "p50_ms": percentile(values, 0.5),
            "p90_ms": percentile(values, 0.9),
            "p99_ms": percentile(values, 0.99),
            "requests": len(values),
        }
    t, i = results["tunnel"], results["intercepted"]
    results["added_p50_ms"] = round(i["p50_ms"] - t["p50_ms"], 2)
    rows = [
        "| HTTPS GET, new connection | through a tunnel | intercepted (a secret's header) |",
        "|---|---|---|",
        f"| p50 | {t['p50_ms']} ms | {i['p50_ms']} ms (+{results['added_p50_ms']} ms) |",
        f"| p90 | {t['p90_ms']} ms | {i['p90_ms']} ms |",
        f"| p99 | {t['p99_ms']} ms | {i['p99_ms']} ms |",
    ]
    report(results, ["\n".join(rows)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

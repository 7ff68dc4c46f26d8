"""Secrets, for real: a gateway on Docker with its egress proxy, an HTTPS upstream in its own
container (a test CA the gateway is told to trust), and code in a sandbox that holds only
placeholders. The upstream writes down every request it gets, so the test sees what
arrived where; the values are then looked for everywhere the gateway writes or answers."""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_egress import make_tls
from tests.support.api import collected
from tests.support.backends import IMAGE, require_docker
from tests.support.server import ServerFactory, ServerThread

VALUE = "sv-" + secrets.token_hex(16)
HEADER_VALUE = "hv-" + secrets.token_hex(16)
ROTATED = "rv-" + secrets.token_hex(16)
UPSTREAM = """
import http.server, json, os, ssl, sys, threading
root = sys.argv[1]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        host = (self.headers.get("Host") or "?").split(":")[0]
        with open(f"{root}/log/{host}.jsonl", "a") as log:
            log.write(json.dumps({"path": self.path, "headers": dict(self.headers)}) + "\\n")
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "https://other.test/echo")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps(dict(self.headers)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Echo", self.headers.get("Authorization", ""))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
def serve(port, tls):
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(root + "/tls/cert.pem", root + "/tls/key.pem")
        bad = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        bad.load_cert_chain(root + "/bad/cert.pem", root + "/bad/key.pem")
        def pick(sock, name, _):
            if name == "bad.test":
                sock.context = bad
        context.sni_callback = pick
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.serve_forever()
threading.Thread(target=serve, args=(80, False), daemon=True).start()
serve(443, True)
"""


def self_signed(folder: Path) -> None:
    """A certificate for bad.test that no CA the gateway trusts signed."""
    folder.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=bad.test", "-addext", "subjectAltName=DNS:bad.test",
         "-keyout", "key.pem", "-out", "cert.pem"],
        cwd=folder, check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_docker()
    import docker
    import docker.types

    client = docker.from_env()
    tag = secrets.token_hex(3)
    folder = tmp_path_factory.mktemp("secret-upstream")
    make_tls(folder / "tls")
    self_signed(folder / "bad")
    (folder / "log").mkdir()
    (folder / "serve.py").write_text(UPSTREAM)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o644)
    pool = docker.types.IPAMPool(subnet="198.51.101.0/24")
    name = f"kg-sec-{tag}"
    network = client.networks.create(
        name, internal=True, ipam=docker.types.IPAMConfig(pool_configs=[pool])
    )
    container = client.containers.create(
        IMAGE,
        ["/opt/venv/bin/python", "/srv/serve.py", "/srv"],
        name=f"kg-sec-up-{tag}",
        user="0:0",
        volumes={str(folder): {"bind": "/srv", "mode": "rw"}},
        network=name,
        networking_config={
            name: client.api.create_endpoint_config(
                aliases=["allowed.test", "other.test", "bad.test"]
            )
        },
    )
    try:
        container.start()
        yield {"network": name, "folder": folder, "ca": folder / "tls" / "ca.pem"}
    finally:
        container.remove(force=True)
        network.reload()
        for attached in network.containers:
            network.disconnect(attached, force=True)
        network.remove()
        client.close()


@pytest.fixture(scope="module")
def gw(
    servers: ServerFactory, upstream: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> ServerThread:
    key = tmp_path_factory.mktemp("secrets-key") / "key"
    key.write_bytes(secrets.token_bytes(32))
    return servers(
        "docker",
        pool_size=1,
        egress_allow="allowed.test,other.test,bad.test",
        egress_networks=upstream["network"],
        secrets_key_file=key,
        egress_ca_file=upstream["ca"],
    )


def requests_to(upstream: dict[str, Any], host: str) -> list[dict[str, Any]]:
    log = Path(upstream["folder"]) / "log" / f"{host}.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def run(gw: ServerThread, sid: str, code: str) -> str:
    with httpx.Client(base_url=gw.url) as client:
        result = collected(client, f"/sessions/{sid}/execute", {"code": code}, timeout=90)
    assert result["status"] == "ok", json.dumps(result)[:3000]
    return str(result["stdout"])


TRY = """
import json, os, requests
def get(url, **headers):
    try:
        r = requests.get(url, headers=headers, timeout=15)
        return {"status": r.status_code, "body": r.text, "echo": r.headers.get("X-Echo", ""),
                "reason": r.reason}
    except Exception as e:
        return {"error": type(e).__name__ + ": " + str(e)[:400]}
"""


@pytest.fixture(scope="module")
def session(gw: ServerThread) -> str:
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        made = http.post(
            "/secrets",
            json={"name": "PLAIN", "value": VALUE, "domains": ["allowed.test"]},
        )
        assert made.status_code == 201, made.text
        assert VALUE not in made.text and made.json()["placeholder"] == "kg-secret:PLAIN"
        made = http.post(
            "/secrets",
            json={
                "name": "API_KEY",
                "value": HEADER_VALUE,
                "domains": ["allowed.test"],
                "header": "X-Api-Key",
            },
        )
        assert made.status_code == 201, made.text
        answer = http.post(
            "/sessions",
            json={
                "network": {"allow": ["allowed.test", "other.test", "bad.test"]},
                "secrets": ["PLAIN", "API_KEY"],
            },
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["secrets"] == ["PLAIN", "API_KEY"]
        return str(answer.json()["id"])


def test_the_value_reaches_its_domain_and_never_comes_back(
    gw: ServerThread, session: str, upstream: dict[str, Any]
) -> None:
    out = json.loads(
        run(
            gw,
            session,
            TRY + "print(json.dumps(get('https://allowed.test/echo', "
            "Authorization='Bearer ' + os.environ['PLAIN'])))",
        )
    )
    assert out["status"] == 200, out
    arrived = requests_to(upstream, "allowed.test")[-1]["headers"]
    assert arrived["Authorization"] == f"Bearer {VALUE}"
    assert arrived["X-Api-Key"] == HEADER_VALUE  # added: the secret has a header
    # The echo (body and a header) comes back with the values masked.
    assert VALUE not in out["body"] and HEADER_VALUE not in out["body"]
    assert "*" * len(VALUE) in out["body"] and out["echo"] == "Bearer " + "*" * len(VALUE)


def test_a_placeholder_sent_elsewhere_is_refused_and_nothing_arrives(
    gw: ServerThread, session: str, upstream: dict[str, Any]
) -> None:
    before = len(requests_to(upstream, "other.test"))
    out = json.loads(
        run(
            gw,
            session,
            TRY + "print(json.dumps([get('https://other.test/echo', "
            "Authorization='Bearer ' + os.environ['PLAIN']), "
            "get('http://allowed.test/echo', Authorization=os.environ['PLAIN']), "
            "get('https://allowed.test/echo?key=' + os.environ['PLAIN']), "
            "get('https://allowed.test/redirect', Authorization='Bearer ' + os.environ['PLAIN']), "
            "get('https://other.test/echo')]))",
        )
    )
    elsewhere, plain_http, in_url, redirected, clean = out
    assert elsewhere["status"] == 403 and "only to allowed.test" in elsewhere["body"], elsewhere
    assert plain_http["status"] == 403 and "HTTPS only" in plain_http["body"], plain_http
    assert in_url["status"] == 403 and "URL" in in_url["body"], in_url
    # The redirect's second request (to other.test) carries no value: requests drops the
    # Authorization header across hosts, and the secret's header is added only for its own.
    assert redirected["status"] == 200, redirected
    assert clean["status"] == 200, clean
    seen = requests_to(upstream, "other.test")[before:]
    assert len(seen) == 2  # the redirect's and the clean one: never the refused one
    assert all(VALUE not in json.dumps(r) and HEADER_VALUE not in json.dumps(r) for r in seen)


def test_the_sandbox_holds_only_placeholders(gw: ServerThread, session: str) -> None:
    out = run(
        gw,
        session,
        "import os, subprocess\n"
        "print(os.environ['PLAIN'], os.environ['API_KEY'])\n"
        "print(open('/proc/self/environ', 'rb').read().decode(errors='replace'))\n"
        "print(subprocess.run(['env'], capture_output=True, text=True).stdout)\n"
        "print(subprocess.run(['grep', '-rIl', 'v-', '/conn', '/home', '/tmp'],"
        " capture_output=True, text=True).stdout)\n",
    )
    assert out.startswith("kg-secret:PLAIN kg-secret:API_KEY\n")
    assert VALUE not in out and HEADER_VALUE not in out
    assert "SSL_CERT_FILE=/conn/egress/ca.pem" in out


def test_a_rotation_reaches_the_next_request(
    gw: ServerThread, session: str, upstream: dict[str, Any]
) -> None:
    changed = httpx.put(f"{gw.url}/secrets/PLAIN", json={"value": ROTATED}, timeout=30)
    assert changed.status_code == 200 and changed.json()["version"] == 2
    run(
        gw,
        session,
        TRY + "print(get('https://allowed.test/echo', Authorization=os.environ['PLAIN']))",
    )
    assert requests_to(upstream, "allowed.test")[-1]["headers"]["Authorization"] == ROTATED


def test_a_hibernated_session_keeps_its_secrets(
    gw: ServerThread, session: str, upstream: dict[str, Any]
) -> None:
    hibernated = httpx.post(f"{gw.url}/sessions/{session}/hibernate", timeout=60)
    assert hibernated.status_code == 200, hibernated.text
    assert hibernated.json()["secrets"] == ["PLAIN", "API_KEY"]
    out = run(  # resumes on a new kernel: its relay, placeholders and trust come back
        gw,
        session,
        TRY + "print(get('https://allowed.test/echo', Authorization=os.environ['PLAIN'])"
        "['status'])",
    )
    assert out == "200\n"
    assert requests_to(upstream, "allowed.test")[-1]["headers"]["X-Api-Key"] == HEADER_VALUE


def test_the_python_client(gw: ServerThread, upstream: dict[str, Any]) -> None:
    from kernel_gateway.client import Client, SecretNotFoundError

    value = "cv-" + secrets.token_hex(12)
    with Client(gw.url) as client:
        made = client.create_secret("CLIENT_KEY", value, ["allowed.test"], header="X-Client")
        assert made["version"] == 1 and value not in json.dumps(client.secrets())
        with client.session(network=["allowed.test"], secrets=["CLIENT_KEY"]) as session:
            assert session.info()["secrets"] == ["CLIENT_KEY"]
            out = session.run(TRY + "print(get('https://allowed.test/echo')['status'])")
            assert out.stdout == "200\n", out
        assert requests_to(upstream, "allowed.test")[-1]["headers"]["X-Client"] == value
        assert client.rotate_secret("CLIENT_KEY", value + "2")["version"] == 2
        client.delete_secret("CLIENT_KEY")
        with pytest.raises(SecretNotFoundError):
            client.delete_secret("CLIENT_KEY")


def test_a_bad_upstream_certificate_is_a_clear_error(gw: ServerThread, session: str) -> None:
    out = json.loads(run(gw, session, TRY + "print(json.dumps(get('https://bad.test/echo')))"))
    assert out["status"] == 502 and "TLS to bad.test failed" in out["body"], out


def test_what_is_refused_at_creation(gw: ServerThread) -> None:
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        wide = http.post(
            "/sessions", json={"network": {"allow": ["other.test"]}, "secrets": ["PLAIN"]}
        )
        assert wide.status_code == 403 and "allowed.test" in wide.json()["error"]["message"]
        unknown = http.post(
            "/sessions", json={"network": {"allow": ["allowed.test"]}, "secrets": ["NOPE"]}
        )
        assert unknown.status_code == 404
        bad = http.post(
            "/secrets", json={"name": "X", "value": "a\r\nInjected: 1", "domains": ["a.test"]}
        )
        assert bad.status_code == 422
        taken = http.post(
            "/secrets", json={"name": "PLAIN", "value": "x", "domains": ["allowed.test"]}
        )
        assert taken.status_code == 409
        # Sessions refused above were not kept.
        assert all(not s["secrets"] or s["secrets"] == ["PLAIN", "API_KEY"]
                   for s in http.get("/sessions").json()["sessions"])  # fmt: skip


def test_the_values_are_nowhere_the_gateway_writes_or_answers(
    gw: ServerThread, session: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        run(
            gw,
            session,
            TRY + "get('https://allowed.test/echo', Authorization=os.environ['PLAIN'])\n"
            "get('https://other.test/echo', Authorization=os.environ['PLAIN'])",
        )
    logged = "\n".join(
        r.getMessage() + json.dumps(getattr(r, "fields", {})) for r in caplog.records
    )
    assert "secret" in logged.lower()  # the use and the refusal are logged, by name
    snapshot = httpx.post(f"{gw.url}/sessions/{session}/snapshots", json={}, timeout=120)
    assert snapshot.status_code == 201, snapshot.text  # its files are searched below
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        answers = [
            http.get(path).text
            for path in ("/secrets", "/secrets/PLAIN", f"/sessions/{session}", "/metrics")
        ]
    on_disk = []
    for path in Path(gw.settings.runtime_dir).rglob("*"):
        if path.is_file() and path.stat().st_size < 10_000_000:
            on_disk.append(path.read_bytes().decode("latin-1"))
    for value in (VALUE, HEADER_VALUE, ROTATED):
        assert value not in logged
        assert all(value not in answer for answer in answers)
        assert all(value not in text for text in on_disk)


def test_e2bs_sdk_makes_a_secret_and_a_sandbox_whose_rules_send_it(
    gw: ServerThread, upstream: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """E2B's SDK, unchanged: `Secret.create`, a sandbox whose `network.rules` add a header
    holding `Secret.fill(...)` for one host, code that never sees the value, and a rotation
    (`Secret.update`) that the next request carries."""
    e2b = pytest.importorskip("e2b")
    from e2b_code_interpreter import Sandbox

    monkeypatch.setenv("E2B_API_URL", gw.url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", gw.url + "/e2b")
    monkeypatch.setenv("E2B_API_KEY", "e2b_" + "0" * 40)
    first, second = "e2b-" + secrets.token_hex(12), "e2b-" + secrets.token_hex(12)
    info = e2b.Secret.create(name="Upstream-Key", value=first)
    assert info.name == "upstream-key" and info.secret_id.startswith("sec_")
    assert [s.name for s in e2b.Secret.list().next_items()].count("upstream-key") == 1
    rule = {"transform": {"headers": {"X-Upstream-Key": e2b.Secret.fill("upstream-key")}}}
    sandbox = Sandbox.create(
        network={"allow_out": ["allowed.test", "other.test"], "rules": {"allowed.test": [rule]}}
    )
    code = (
        "import os, requests\n"
        "r = requests.get('https://allowed.test/echo', timeout=15)\n"
        "print(r.status_code, 'X-Upstream-Key' in r.text)\n"
        "print(requests.get('https://other.test/echo', timeout=15).status_code)\n"
    )
    try:
        out = sandbox.run_code(code)
        assert out.error is None, out.error
        assert "".join(out.logs.stdout) == "200 True\n200\n"
        assert requests_to(upstream, "allowed.test")[-1]["headers"]["X-Upstream-Key"] == first
        assert "X-Upstream-Key" not in requests_to(upstream, "other.test")[-1]["headers"]
        assert first not in json.dumps(requests_to(upstream, "other.test"))
        e2b.Secret.update("upstream-key", value=second)
        assert sandbox.run_code(code).error is None
        assert requests_to(upstream, "allowed.test")[-1]["headers"]["X-Upstream-Key"] == second
        shown = sandbox.commands.run("env; cat /proc/self/environ")
        assert first not in shown.stdout and second not in shown.stdout
    finally:
        sandbox.kill()
        e2b.Secret.destroy("upstream-key")


def test_a_session_keeps_its_secrets_across_a_sigkill(
    upstream: dict[str, Any], tmp_path: Path
) -> None:
    """With --persist-sessions a SIGKILLed gateway's successor adopts the session: its
    kernel keeps the placeholders and the CA, and its new relay puts the value in again."""
    import signal

    from tests.integration.test_persistence import Gateway as Durable

    key = tmp_path / "secrets.key"
    key.write_bytes(secrets.token_bytes(32))
    flags = (
        "--pool-size", "1",
        "--egress-allow", "allowed.test,other.test",
        "--egress-networks", upstream["network"],
        "--secrets-key-file", str(key),
        "--egress-ca-file", str(upstream["ca"]),
    )  # fmt: skip
    gw = Durable(tmp_path, *flags)
    value = "kv-" + secrets.token_hex(12)
    code = TRY + "print(get('https://allowed.test/echo')['status'], os.environ['KILLED'])"
    try:
        gw.start()
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            made = http.post(
                "/secrets",
                json={"name": "KILLED", "value": value, "domains": ["allowed.test"],
                      "header": "X-Killed"},
            )  # fmt: skip
            assert made.status_code == 201, made.text
            sid = http.post(
                "/sessions", json={"network": {"allow": ["allowed.test"]}, "secrets": ["KILLED"]}
            ).json()["id"]
            before = collected(http, f"/sessions/{sid}/execute", {"code": code}, timeout=90)
        assert before["stdout"] == "200 kg-secret:KILLED\n", before
        assert requests_to(upstream, "allowed.test")[-1]["headers"]["X-Killed"] == value
        gw.stop(signal.SIGKILL)
        gw.start()
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            assert http.get(f"/sessions/{sid}").json()["secrets"] == ["KILLED"]
            after = collected(http, f"/sessions/{sid}/execute", {"code": code}, timeout=90)
            assert after["stdout"] == "200 kg-secret:KILLED\n", after
            assert requests_to(upstream, "allowed.test")[-1]["headers"]["X-Killed"] == value
            http.delete(f"/sessions/{sid}")
        gw.stop()
    finally:
        gw.close()

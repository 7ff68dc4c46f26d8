"""Network by policy, for real: squid in its container, kernels in theirs, upstreams in a
container on networks this test makes (internal: nothing leaves the machine).

    kg-egt-pub-*   198.51.100.0/24 (TEST-NET-2: not a private range), internal: the
                   upstream as allowed.test, other.test and x.cdn.test: HTTP on 80, HTTPS
                   on 443 (a certificate of a CA made here), a package index of one wheel
    kg-egt-priv-*  10.213.7.0/24, internal: the same upstream as private.test

The gateway's egress proxy joins both networks; kernels join none.
"""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import signal
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import collected
from tests.support.backends import IMAGE, require_docker, require_gvisor, require_languages
from tests.support.ports import free_port
from tests.support.processes import Gateway as GatewayProcess
from tests.support.processes import serve_command
from tests.support.server import ServerFactory, ServerThread

CEILING = "allowed.test,other.test,private.test,*.cdn.test"
UPSTREAM = """
import http.server, ssl, sys, threading
root = sys.argv[1]
class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=root + "/site", **kwargs)
    def log_message(self, *args):
        pass
def serve(port, tls):
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(root + "/tls/cert.pem", root + "/tls/key.pem")
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.serve_forever()
threading.Thread(target=serve, args=(80, False), daemon=True).start()
serve(443, True)
"""
# Each attempt: "reached", or the exception's name and message; and how long it took.
ATTEMPT = """
import json, socket, time, urllib.request
import requests
def get(url, **kw):  # an HTTP error (the proxy's 403) is a failure too
    answer = requests.get(url, timeout=10, **kw)
    answer.raise_for_status()
    return answer
def attempt(fn):
    t = time.monotonic()
    try:
        fn()
        outcome = "reached"
    except Exception as e:
        outcome = type(e).__name__ + ": " + str(e)[:300]
    return [outcome, round(time.monotonic() - t, 2)]
"""


def make_tls(folder: Path) -> None:
    """A CA, and a certificate it signs for the upstream's names."""
    folder.mkdir()
    names = "subjectAltName=DNS:allowed.test,DNS:other.test,DNS:private.test,DNS:x.cdn.test"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    # What Python 3.13's strict verification asks of a CA and a leaf (key usages, key ids).
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=kg test CA", "-keyout", "ca.key", "-out", "ca.pem",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=allowed.test",
            "-keyout", "key.pem", "-out", "cert.csr")  # fmt: skip
    (folder / "ext.cnf").write_text(
        f"{names}\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\nbasicConstraints=critical,CA:FALSE\n"
    )
    openssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", "cert.pem", "-extfile", "ext.cnf")  # fmt: skip


def make_wheel() -> tuple[str, bytes]:
    """A pure-Python wheel of `kgthing` 1.0."""
    name = "kgthing-1.0-py3-none-any.whl"
    info = "kgthing-1.0.dist-info"
    files = {
        "kgthing/__init__.py": "VALUE = 'from the allowed index'\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: kgthing\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kg-test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return name, buffer.getvalue()


def _git_repository(bare: Path, work: Path) -> None:
    """A repository of one file, served over git's "dumb" HTTP (static files)."""

    def git(*args: str, cwd: Path = work) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    (work / "README").write_text("cloned through the proxy\n")
    git("add", "README")
    git("-c", "user.name=kg", "-c", "user.email=kg@test", "commit", "-q", "-m", "one")
    git("clone", "-q", "--bare", str(work), str(bare), cwd=work.parent)
    git("update-server-info", cwd=bare)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The upstream container on both test networks: the networks, its public address,
    and the test CA's certificate."""
    require_docker()
    import docker
    import docker.types

    client = docker.from_env()
    tag = secrets.token_hex(3)
    folder = tmp_path_factory.mktemp("upstream")
    make_tls(folder / "tls")
    site = folder / "site"
    (site / "simple" / "kgthing").mkdir(parents=True)
    (site / "data.csv").write_text("a,b\n1,2\n3,4\n")
    name, wheel = make_wheel()
    (site / name).write_bytes(wheel)
    (site / "simple" / "kgthing" / "index.html").write_text(
        f'<html><body><a href="/{name}">{name}</a></body></html>'
    )
    _git_repository(site / "repo.git", tmp_path_factory.mktemp("repo"))
    (folder / "serve.py").write_text(UPSTREAM)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)

    def network(kind: str, subnet: str) -> Any:
        pool = docker.types.IPAMPool(subnet=subnet)
        return client.networks.create(
            f"kg-egt-{kind}-{tag}", internal=True, ipam=docker.types.IPAMConfig(pool_configs=[pool])
        )

    public, private = network("pub", "198.51.100.0/24"), network("priv", "10.213.7.0/24")
    aliases = ["allowed.test", "other.test", "x.cdn.test"]
    container = client.containers.create(
        IMAGE,
        ["/opt/venv/bin/python", "/srv/serve.py", "/srv"],
        name=f"kg-egt-up-{tag}",
        user="0:0",  # ports 80 and 443; a test upstream on internal networks only
        volumes={str(folder): {"bind": "/srv", "mode": "ro"}},
        network=public.name,
        networking_config={public.name: client.api.create_endpoint_config(aliases=aliases)},
    )
    try:
        private.connect(container, aliases=["private.test"])
        container.start()
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][public.name]["IPAddress"]
        yield {
            "networks": f"{public.name},{private.name}",
            "address": address,
            "ca": (folder / "tls" / "ca.pem").read_text(),
        }
    finally:
        container.remove(force=True)
        for net in (public, private):  # the gateway's proxy may still be on them
            net.reload()
            for attached in net.containers:
                net.disconnect(attached, force=True)
            net.remove()
        client.close()


def start(servers: ServerFactory, upstream: dict[str, str], backend: str) -> ServerThread:
    return servers(
        backend,
        pool_size=1,
        max_sessions=32,  # the tests leave their sessions to the gateway's end
        egress_allow=CEILING,
        egress_networks=upstream["networks"],
    )


@pytest.fixture(scope="module")
def gw(servers: ServerFactory, upstream: dict[str, str]) -> ServerThread:
    return start(servers, upstream, "docker")


def new_session(gw: ServerThread, network: object, ca: str | None = None) -> str:
    answer = httpx.post(f"{gw.url}/sessions", json={"network": network}, timeout=120)
    assert answer.status_code == 201, answer.text
    sid = str(answer.json()["id"])
    if ca is not None:
        put = httpx.put(f"{gw.url}/sessions/{sid}/files/ca.pem", content=ca.encode())
        assert put.is_success, put.text
    return sid


def run(gw: ServerThread, sid: str, code: str, timeout: float = 60) -> str:
    """The cell's stdout (it must end ok)."""
    with httpx.Client(base_url=gw.url) as client:
        body = {"code": code, "timeout": timeout}
        result = collected(client, f"/sessions/{sid}/execute", body, timeout=timeout + 30)
    assert result["status"] == "ok", json.dumps(result)[:3000]
    return str(result["stdout"])


def attempts(gw: ServerThread, sid: str, tries: dict[str, str]) -> dict[str, list[Any]]:
    """Each named expression tried in the session: its outcome and its seconds."""
    body = "\n".join(f"out[{name!r}] = attempt(lambda: {code})" for name, code in tries.items())
    code = ATTEMPT + "out = {}\n" + body + "\nprint(json.dumps(out))"
    found: dict[str, list[Any]] = json.loads(run(gw, sid, code))
    return found


def metric(gw: ServerThread, decision: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics").text.splitlines():
        if line.startswith(f'kernel_gateway_egress_requests_total{{decision="{decision}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no egress metric for {decision}")


def test_a_session_reaches_what_it_is_allowed_and_nothing_else(
    gw: ServerThread, upstream: dict[str, str]
) -> None:
    sid = new_session(gw, {"allow": ["allowed.test", "private.test"]}, upstream["ca"])
    assert httpx.get(f"{gw.url}/sessions/{sid}").json()["network"] == {
        "allow": ["allowed.test", "private.test"]
    }
    shown = run(
        gw,
        sid,
        "import io, requests, pandas as pd\n"
        "text = requests.get('https://allowed.test/data.csv', verify='ca.pem', timeout=10).text\n"
        "print(pd.read_csv(io.StringIO(text)).sum().to_dict())\n"
        "print(requests.get('http://allowed.test/data.csv', timeout=10).status_code)",
    )
    assert shown == "{'a': 4, 'b': 6}\n200\n"
    installed = run(
        gw,
        sid,
        "!pip install --quiet --cert ca.pem --target pkgs --index-url "
        "https://allowed.test/simple kgthing\n"
        "import sys; sys.path.insert(0, 'pkgs'); import kgthing; print(kgthing.VALUE)",
        timeout=120,
    )
    assert installed.strip().endswith("from the allowed index"), installed
    address = upstream["address"]
    before = metric(gw, "refused")
    found = attempts(
        gw,
        sid,
        {
            "other": "get('https://other.test/data.csv')",
            "other_http": "get('http://other.test/data.csv')",
            "literal": f"get('https://{address}/data.csv')",
            "private": "get('https://private.test/data.csv')",
            "metadata": "get('http://169.254.169.254/latest/meta-data/')",
            "port": "get('http://allowed.test:8080/')",
            "direct": f"socket.create_connection(('{address}', 443), 5)",
            "gateway": f"get('{gw.url}/health')",
            "gateway_proxied": f"get('{gw.url}/health', proxies={{'http': 'http://127.0.0.1:3128'}})",
            "bridge_host": "get('http://172.17.0.1:2375/version')",
            "docker_socket": "socket.socket(socket.AF_UNIX).connect('/var/run/docker.sock')",
            "dns": "socket.getaddrinfo('allowed.test', 443)",
            "udp": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            f".sendto(b'x', ('{address}', 53))",
        },
    )
    for name, (outcome, seconds) in found.items():
        assert outcome != "reached" and seconds < 2, (name, found)
    assert "network policy" in found["other"][0] and "other.test" in found["other"][0], found
    assert "network policy" in found["private"][0] and "private" in found["private"][0], found
    assert "IP address" in found["literal"][0], found
    assert metric(gw, "refused") >= before + 5
    assert metric(gw, "allowed") >= 3


def test_what_a_keys_sessions_fetch_is_counted_in_its_usage(
    gw: ServerThread, upstream: dict[str, str]
) -> None:
    """Egress bytes per API key: every byte through the session's relay, both ways, added
    to its owner's usage at the next 5-second sample."""
    made = httpx.post(f"{gw.url}/keys", json={"name": "egress-counted"})  # an open gateway
    assert made.status_code == 201, made.text
    key = made.json()
    bearer = {"Authorization": f"Bearer {key['secret']}"}
    answer = httpx.post(
        f"{gw.url}/sessions",
        json={"network": {"allow": ["allowed.test"]}},
        headers=bearer,
        timeout=120,
    )
    assert answer.status_code == 201 and answer.json()["owner"] == key["id"], answer.text
    sid = answer.json()["id"]
    code = (
        "import requests\n"
        "sizes = [len(requests.get('http://allowed.test/data.csv', timeout=10).content)"
        " for _ in range(20)]\nprint(sum(sizes))"
    )
    with httpx.Client(base_url=gw.url, headers=bearer) as client:
        result = collected(client, f"/sessions/{sid}/execute", {"code": code}, timeout=90)
    assert result["status"] == "ok", result
    fetched = int(result["stdout"])
    deadline = time.monotonic() + 20
    while True:
        used = httpx.get(f"{gw.url}/keys/{key['id']}/usage").json()
        if used["egress_bytes"] > fetched or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # The bodies, their heads and the requests' (over plain HTTP: nothing hides them).
    assert fetched + 20 * 100 < used["egress_bytes"] < fetched + 20 * 2000, (fetched, used)
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert 'kernel_gateway_key_egress_bytes_total{key="egress-counted"}' in metrics
    httpx.delete(f"{gw.url}/sessions/{sid}")


def test_sessions_without_a_policy_or_with_another_one_reach_nothing_of_the_first(
    gw: ServerThread,
) -> None:
    first = new_session(gw, {"allow": ["allowed.test"]})
    nothing = new_session(gw, "none")
    other = new_session(gw, {"allow": ["other.test"]})
    assert httpx.get(f"{gw.url}/sessions/{nothing}").json()["network"] == "none"
    stolen = "Basic " + base64.b64encode(f"{first}:guess".encode()).decode()
    tries = {
        "plain": "get('http://allowed.test/data.csv')",
        "as_first": "get('http://allowed.test/data.csv', "
        f"headers={{'Proxy-Authorization': {stolen!r}}})",
        "through_proxy": "get('http://allowed.test/data.csv', "
        "proxies={'http': 'http://127.0.0.1:3128'})",
    }
    for sid in (nothing, other):
        found = attempts(gw, sid, tries)
        for name, (outcome, seconds) in found.items():
            assert outcome != "reached" and seconds < 2, (sid, name, found)
    own = attempts(gw, other, {"own": "get('http://other.test/data.csv')"})
    assert own["own"][0] == "reached", own


def test_policies_beyond_the_ceiling_or_malformed_are_refused(gw: ServerThread) -> None:
    wide = httpx.post(f"{gw.url}/sessions", json={"network": {"allow": ["evil.test"]}})
    assert wide.status_code == 403, wide.text
    error = wide.json()["error"]
    assert error["type"] == "network_not_allowed" and "evil.test" in error["message"]
    for bad in ({"allow": ["1.2.3.4"]}, {"allow": ["*"]}, {"allow": "allowed.test"}, "all"):
        answer = httpx.post(f"{gw.url}/sessions", json={"network": bad})
        # beyond the ceiling whatever it is (403, saying why it is no pattern), else 4xx
        assert answer.status_code in (400, 403, 422), (bad, answer.text)
    within = httpx.post(f"{gw.url}/sessions", json={"network": {"allow": ["A.CDN.test."]}})
    assert within.status_code == 201, within.text
    assert within.json()["network"] == {"allow": ["a.cdn.test"]}
    httpx.delete(f"{gw.url}/sessions/{within.json()['id']}")


def test_a_stateless_call_takes_a_policy(gw: ServerThread) -> None:
    answer = httpx.post(
        f"{gw.url}/execute",
        json={
            "code": "import urllib.request\n"
            "print(urllib.request.urlopen('http://allowed.test/data.csv', timeout=10).read())",
            "network": {"allow": ["allowed.test"]},
        },
        headers={"Accept": "application/json"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "b'a,b\\n1,2\\n3,4\\n'\n", answer.json()


def test_a_restarted_kernel_keeps_its_sessions_policy(gw: ServerThread) -> None:
    sid = new_session(gw, {"allow": ["allowed.test"]})
    assert httpx.post(f"{gw.url}/sessions/{sid}/restart", timeout=120).is_success
    reaches_only_allowed(gw, sid)


def reaches_only_allowed(gw: ServerThread, sid: str) -> None:
    found = attempts(
        gw,
        sid,
        {
            "allowed": "get('http://allowed.test/data.csv')",
            "other": "get('http://other.test/data.csv')",
        },
    )
    assert found["allowed"][0] == "reached" and found["other"][0] != "reached", found


def test_a_resumed_session_keeps_its_policy(gw: ServerThread) -> None:
    """Hibernated, then resumed onto a warm kernel: its way out is set up in that kernel
    before its variables come back; still only its own domains."""
    sid = new_session(gw, {"allow": ["allowed.test"]})
    assert "ok" in run(gw, sid, "kept = 'ok'; print(kept)")
    answer = httpx.post(f"{gw.url}/sessions/{sid}/hibernate", timeout=120)
    assert answer.status_code == 200 and answer.json()["status"] == "hibernated", answer.text
    assert answer.json()["network"] == {"allow": ["allowed.test"]}
    reaches_only_allowed(gw, sid)
    assert "ok" in run(gw, sid, "print(kept)")


def test_under_gvisor_too(servers: ServerFactory, upstream: dict[str, str]) -> None:
    require_gvisor()
    gvisor = start(servers, upstream, "gvisor")
    sid = new_session(gvisor, {"allow": ["allowed.test"]})
    found = attempts(
        gvisor,
        sid,
        {
            "allowed": "get('http://allowed.test/data.csv')",
            "other": "get('http://other.test/data.csv')",
            "direct": f"socket.create_connection(('{upstream['address']}', 80), 5)",
        },
    )
    assert found["allowed"][0] == "reached", found
    assert found["other"][0] != "reached" and found["direct"][0] != "reached", found
    assert found["other"][1] < 2 and found["direct"][1] < 2, found


def test_each_decision_is_logged_with_its_session(
    gw: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    sid = new_session(gw, {"allow": ["allowed.test"]})
    with caplog.at_level("INFO", logger="kernel_gateway.sessions.network"):
        attempts(
            gw,
            sid,
            {"ok": "get('http://allowed.test/data.csv')", "no": "get('http://other.test/')"},
        )
    lines = [
        (r.levelname, r.getMessage(), getattr(r, "fields", {}))
        for r in caplog.records
        if r.name == "kernel_gateway.sessions.network"
    ]
    assert ("INFO", "egress allowed GET allowed.test", {"egress": "allowed", "host": "allowed.test",
            "method": "GET", "reason": None}) in lines, lines  # fmt: skip
    refused = [line for line in lines if line[2].get("egress") == "refused"]
    assert refused and refused[0][0] == "WARNING" and "other.test" in refused[0][1], lines


def test_a_running_sessions_policy_is_changed_live(gw: ServerThread) -> None:
    """No network, then one domain, then another, then none again, on the same kernel: new
    connections follow the new policy (a narrowing within the proxy's 5 s of remembered
    allows); a variable survives it all; a change
    beyond the ceiling is refused and changes nothing."""
    sid = new_session(gw, "none")
    tries = {
        "allowed": "get('http://allowed.test/data.csv')",
        "other": "get('http://other.test/data.csv')",
    }
    run(gw, sid, "kept = 42")
    outcomes = {}
    for policy in ({"allow": ["allowed.test"]}, {"allow": ["other.test"]}, "none"):
        answer = httpx.put(f"{gw.url}/sessions/{sid}/network", json={"network": policy})
        assert answer.status_code == 200, answer.text
        assert answer.json()["network"] == policy
        time.sleep(6)  # an allowing decision is remembered 5 s (squid_conf.DECISION_SECONDS)
        found = attempts(gw, sid, tries)
        outcomes[str(policy)] = {name: outcome == "reached" for name, (outcome, _) in found.items()}
    assert outcomes == {
        "{'allow': ['allowed.test']}": {"allowed": True, "other": False},
        "{'allow': ['other.test']}": {"allowed": False, "other": True},
        "none": {"allowed": False, "other": False},
    }, outcomes
    wide = httpx.put(f"{gw.url}/sessions/{sid}/network", json={"network": {"allow": ["evil.test"]}})
    assert wide.status_code == 403 and wide.json()["error"]["type"] == "network_not_allowed"
    bad = httpx.put(f"{gw.url}/sessions/{sid}/network", json={"allow": ["allowed.test"]})
    assert bad.status_code == 422, bad.text
    assert httpx.get(f"{gw.url}/sessions/{sid}").json()["network"] == "none"
    assert run(gw, sid, "print(kept)") == "42\n"


def test_e2bs_sdk_asks_for_domains_with_allow_out(gw: ServerThread) -> None:
    sdk = pytest.importorskip("e2b_code_interpreter")
    exceptions = pytest.importorskip("e2b.exceptions")
    base = gw.url + "/e2b"
    options = {"api_key": "e2b_00", "api_url": base, "sandbox_url": base}
    sbx = sdk.Sandbox.create(network={"allow_out": ["allowed.test"]}, **options)
    try:
        fetched = sbx.run_code(
            "import urllib.request\n"
            "urllib.request.urlopen('http://allowed.test/data.csv', timeout=10).read()"
        )
        assert fetched.text == "b'a,b\\n1,2\\n3,4\\n'", fetched
        command = sbx.commands.run(
            'python3 -c "import urllib.request as u; '
            "print(u.urlopen('http://allowed.test/data.csv', timeout=10).status)\""
        )
        assert command.stdout == "200\n", command
    finally:
        sbx.kill()
    with pytest.raises(exceptions.SandboxException, match="evil.test"):
        sdk.Sandbox.create(network={"allow_out": ["evil.test"]}, **options)
    plain = sdk.Sandbox.create(**options)  # no rules: the gateway's default, none here
    try:
        refused = plain.run_code(
            "import urllib.request\nurllib.request.urlopen('http://allowed.test/', timeout=5)"
        )
        assert refused.error is not None
    finally:
        plain.kill()


async def test_mcps_run_python_asks_for_domains(gw: ServerThread) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    def text(result: Any) -> str:
        return "".join(getattr(c, "text", "") for c in result.content)

    code = "import urllib.request\nprint(urllib.request.urlopen('{}', timeout=10).status)"
    http = httpx2.AsyncClient(timeout=120)
    transport = streamable_http_client(f"{gw.url}/mcp", http_client=http)
    async with http, Client(transport) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        network = tools["run_python"].input_schema["properties"]["network"]
        assert "allowed.test" in network["description"], network
        ok = await client.call_tool(
            "run_python",
            {"code": code.format("http://allowed.test/data.csv"), "network": ["allowed.test"]},
        )
        assert not ok.is_error and text(ok).startswith("200"), text(ok)
        refused = await client.call_tool(
            "run_python",
            {"code": code.format("http://other.test/data.csv"), "network": ["allowed.test"]},
        )
        assert refused.is_error and "network policy" in text(refused), text(refused)
        wide = await client.call_tool("run_python", {"code": "1", "network": ["evil.test"]})
        assert wide.is_error and "evil.test" in text(wide), text(wide)


def test_jupyters_kernel_env_names_the_domains(gw: ServerThread) -> None:
    started = httpx.post(
        f"{gw.url}/api/kernels",
        json={"name": "python3", "env": {"KERNEL_NETWORK_ALLOW": "allowed.test"}},
        timeout=120,
    )
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]
    sessions = {s["id"]: s for s in httpx.get(f"{gw.url}/sessions").json()["sessions"]}
    assert {"allow": ["allowed.test"]} in [s["network"] for s in sessions.values()]
    httpx.delete(f"{gw.url}/api/kernels/{kernel_id}")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_durable_sessions_policy_survives_a_restart(
    tmp_path: Path, upstream: dict[str, str], how: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("durable sessions run a root gateway (capped session disks)")
    port = free_port()
    cmd = serve_command(
        tmp_path / "rt", port, "--backend", "docker", "--pool-size", "1",
        "--egress-allow", CEILING, "--egress-networks", upstream["networks"],
    )  # fmt: skip
    gateway = GatewayProcess(cmd, port, tmp_path, env={"KG_PRELOAD": ""}, up_within=90)
    gateway.start("--persist-sessions")
    try:
        with gateway.client(timeout=120) as http:
            made = http.post("/sessions", json={"network": {"allow": ["allowed.test"]}})
            sid = made.json()["id"]
            keep = http.post(f"/sessions/{sid}/execute", json={"code": "kept = 41"})
            assert keep.status_code == 200
        gateway.stop(getattr(signal, how))
        gateway.start("--persist-sessions")
        with gateway.client(timeout=120) as http:
            assert http.get(f"/sessions/{sid}").json()["network"] == {"allow": ["allowed.test"]}
        tries = {
            "kept": "globals()['kept']",
            "allowed": "get('http://allowed.test/data.csv')",
            "other": "get('http://other.test/data.csv')",
        }
        found = attempts(gateway, sid, tries)  # type: ignore[arg-type]
        assert found["kept"][0] == "reached" and found["allowed"][0] == "reached", found
        assert found["other"][0] != "reached", found
    finally:
        gateway.stop(signal.SIGKILL)
        gateway.start()  # without the flag: it adopts what is left, and removes it at its stop
        gateway.stop()


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("r", "x <- readLines(url('http://allowed.test/data.csv')); cat(x[2])\n"
              "r <- tryCatch(readLines(url('http://other.test/data.csv')), "
              "error = function(e) 'refused', warning = function(w) 'refused'); cat('', r)"),
        ("javascript", "const ok = await (await fetch('http://allowed.test/data.csv')).text();\n"
                       "const no = await fetch('http://other.test/data.csv');\n"
                       "console.log(ok.split('\\n')[1], no.status);"),
        ("java", "var c = java.net.http.HttpClient.newHttpClient();\n"
                 "java.util.function.Function<String, java.net.http.HttpResponse<String>> get = "
                 "u -> { try { return c.send(java.net.http.HttpRequest.newBuilder("
                 "java.net.URI.create(u)).build(), "
                 "java.net.http.HttpResponse.BodyHandlers.ofString()); } "
                 "catch (Exception e) { throw new RuntimeException(e); } };\n"
                 "System.out.println(get.apply(\"http://allowed.test/data.csv\").body()"
                 ".split(\"\\n\")[1] + \" \" + "
                 "get.apply(\"http://other.test/data.csv\").statusCode());"),
        ("bash", "curl -s http://allowed.test/data.csv | sed -n 2p; "
                 "curl -s -o /dev/null -w ' %{http_code}' http://other.test/data.csv; "
                 "echo; git -c http.sslCAInfo=ca.pem clone -q https://allowed.test/repo.git r "
                 "&& cat r/README"),
    ],
)  # fmt: skip
def test_other_languages_use_the_proxy(
    gw: ServerThread, upstream: dict[str, str], language: str, code: str
) -> None:
    require_languages(language)
    made = httpx.post(
        f"{gw.url}/sessions",
        json={"language": language, "network": {"allow": ["allowed.test"]}},
        timeout=120,
    )
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    assert httpx.put(f"{gw.url}/sessions/{sid}/files/ca.pem", content=upstream["ca"]).is_success
    shown = run(gw, sid, code)
    assert shown.split()[0] == "1,2", shown
    assert shown.split()[1] in ("refused", "403"), shown
    if language == "bash":  # git over HTTPS, through the proxy
        assert "cloned through the proxy" in shown, shown


# -- template builds ----------------------------------------------------------------------------

FETCH = (
    '/opt/venv/bin/python -c "import urllib.request; '
    "print(urllib.request.urlopen('http://{host}/data.csv', timeout=10).read().decode())\""
)


def build(gw: ServerThread, name: str, commands: list[str]) -> dict[str, Any]:
    """A template of `commands` (RUN as root) built on `gw`: its record once finished, and
    its build's log lines under `log`."""
    steps = [{"type": "RUN", "args": [command, "root"]} for command in commands]
    with httpx.Client(base_url=gw.url, timeout=60) as client:
        started = client.post("/templates", json={"name": name, "steps": steps})
        assert started.status_code == 202, started.text
        build_id = started.json()["id"]
        deadline = time.monotonic() + 300
        while client.get(f"/templates/{name}").json()["state"] not in ("ready", "error"):
            assert time.monotonic() < deadline, f"the build of {name} did not end"
            time.sleep(0.5)
        logs = client.get(
            f"/templates/{name}/builds/{build_id}/logs", headers={"Accept": "application/json"}
        )
        assert logs.status_code == 200, logs.text
        record: dict[str, Any] = client.get(f"/templates/{name}").json()
        record["log"] = [entry["message"] for entry in logs.json()["logs"]]
        return record


def test_a_build_reaches_the_operators_build_allowlist_and_nothing_else(
    servers: ServerFactory, upstream: dict[str, str], gw: ServerThread
) -> None:
    builder = servers(
        "docker",
        pool_size=0,
        build_egress_allow="allowed.test",  # sessions may reach nothing (no --egress-allow)
        egress_networks=upstream["networks"],
        template_pip="container",
    )
    pip = (
        "/opt/venv/bin/pip install --no-cache-dir --index-url http://allowed.test/simple "
        "--trusted-host allowed.test kgthing"
    )
    made = build(builder, "netbuild", [FETCH.format(host="allowed.test"), pip])
    try:
        assert made["state"] == "ready", made
        assert "a,b" in made["log"], made["log"]
        answer = httpx.post(f"{builder.url}/sessions", json={"template": "netbuild"}, timeout=120)
        assert answer.status_code == 201, answer.text
        session = answer.json()["id"]
        shown = run(
            builder,
            session,
            "import os, kgthing; print(kgthing.VALUE)\n"
            "print(sorted(k for k in os.environ if 'proxy' in k.lower()))",
        )
        # The package is in the image; the build's proxy settings are not.
        assert shown == "from the allowed index\n[]\n", shown
        assert httpx.delete(f"{builder.url}/sessions/{session}").status_code == 204
        refused = build(builder, "netrefused", [FETCH.format(host="other.test")])
        assert refused["state"] == "error", refused
        assert any(
            "network: refused" in line and "other.test is not in this build's" in line
            for line in refused["log"]
        ), refused["log"]
        # A session on this gateway asks for a domain: none is allowed to sessions.
        answer = httpx.post(
            f"{builder.url}/sessions", json={"network": {"allow": ["allowed.test"]}}
        )
        assert answer.status_code == 403, answer.text
    finally:
        for name in ("netbuild", "netrefused"):
            removed = httpx.delete(f"{builder.url}/templates/{name}", timeout=60)
            assert removed.status_code == 204, removed.text
    # A gateway without --build-egress-allow: its builds have no network at all.
    offline = build(gw, "nonet", [FETCH.format(host="allowed.test")])
    try:
        assert offline["state"] == "error", offline
        assert not any("a,b" in line for line in offline["log"]), offline["log"]
    finally:
        httpx.delete(f"{gw.url}/templates/nonet", timeout=60)


def test_a_session_on_a_template_reaches_only_what_its_policy_allows(
    gw: ServerThread, upstream: dict[str, str]
) -> None:
    """A template's sessions are held to network policies as other sessions are: with an
    allowlist, that and nothing else; without one, nothing."""
    made = build(gw, "tplpolicy", ["echo on-the-template > /opt/mark"])
    started: list[str] = []
    try:
        assert made["state"] == "ready", made
        for network in ({"allow": ["allowed.test"]}, None):
            body: dict[str, Any] = {"template": "tplpolicy"}
            if network is not None:
                body["network"] = network
            answer = httpx.post(f"{gw.url}/sessions", json=body, timeout=120)
            assert answer.status_code == 201, answer.text
            assert answer.json()["template"]["name"] == "tplpolicy"
            started.append(answer.json()["id"])
        allowed, plain = started
        assert httpx.get(f"{gw.url}/sessions/{plain}").json()["network"] == "none"
        for sid in started:
            assert run(gw, sid, "print(open('/opt/mark').read().strip())") == "on-the-template\n"
        reaches_only_allowed(gw, allowed)
        tries = {
            "allowed": "get('http://allowed.test/data.csv')",
            "through_proxy": "get('http://allowed.test/data.csv', "
            "proxies={'http': 'http://127.0.0.1:3128'})",
            "direct": f"socket.create_connection(('{upstream['address']}', 80), 5)",
        }
        found = attempts(gw, plain, tries)
        for name, (outcome, _) in found.items():
            assert outcome != "reached", (name, found)
    finally:
        for sid in started:
            httpx.delete(f"{gw.url}/sessions/{sid}", timeout=60)
        httpx.delete(f"{gw.url}/templates/tplpolicy", timeout=60)

"""The shipped `python-classic` template on a real gateway (Docker, gVisor): built at startup
by `--builtin-templates python-classic` on the Python 3.11 image, its sessions run what
pandas 2 and NumPy 2 removed (`DataFrame.append`, `np.in1d`), the default image's do not.

The Python 3.11 image is not made by `make image` (docs/templates.md, "Classic stack"):
this module brings it up to date first (`build_python311_image`, a few minutes the first
time, seconds from Docker's layer cache after). Where that cannot be done it fails with
KG_REQUIRE_DOCKER=1, else it skips.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel_gateway.templates.builtin import python311_image
from tests.support.api import Stream, execute, parse_sse
from tests.support.backends import IMAGE, REQUIRE_DOCKER, require_gvisor
from tests.support.server import ServerFactory, ServerThread

CLASSIC = "python-classic"
BUILD_TIMEOUT = 1500.0  # the template's build, under its own --template-build-timeout (1800)


def bring_python311_image() -> str:
    """Build (or refresh from cache) the Python 3.11 image; its name. Fails the module with
    KG_REQUIRE_DOCKER=1 when it cannot be built, else skips it."""
    import docker

    from kernel_gateway.cli.image import default_context
    from kernel_gateway.cli.main import default_cache_dir
    from kernel_gateway.cli.python_image import build_python311_image

    require_gvisor()
    lines: list[str] = []
    client = docker.from_env(timeout=600)
    try:
        arch = str(client.version().get("Arch", "amd64"))
        started = time.monotonic()
        tag = build_python311_image(
            client, IMAGE, default_context(), default_cache_dir(os.environ), lines.append,
            arch=arch,
        )  # fmt: skip
        print(f"{tag}: up to date in {time.monotonic() - started:.1f} s")
        return tag
    except (SystemExit, docker.errors.DockerException) as exc:
        reason = (
            f"the Python 3.11 image {python311_image(IMAGE)} could not be built ({exc}):\n"
            + "\n".join(lines[-20:])
        )
        if REQUIRE_DOCKER:
            pytest.fail(f"KG_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    finally:
        client.close()


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    bring_python311_image()
    return servers("gvisor", pool_size=0, token="tok", builtin_templates=CLASSIC)


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": "Bearer tok"}
    with httpx.Client(base_url=server.url, timeout=180, headers=headers) as c:
        yield c


def built(client: httpx.Client) -> tuple[dict[str, Any], list[str]]:
    """The template's build the gateway started by itself, followed to its end."""
    deadline = time.monotonic() + 120
    while (response := client.get(f"/templates/{CLASSIC}")).status_code == 404:
        assert time.monotonic() < deadline, "the gateway never started building python-classic"
        time.sleep(0.5)
    template = response.json()
    build = template["builds"][-1]
    assert build["base"] == "python3.11"
    lines: list[str] = []
    path = f"/templates/{CLASSIC}/builds/{build['id']}/logs"
    with client.stream("GET", path, timeout=BUILD_TIMEOUT) as stream:
        for event, data in parse_sse(stream.iter_bytes()):
            if event == "log":
                lines.append(data["message"])
            elif event == "end":
                return data, lines
    raise AssertionError(f"the log ended without its end event:\n{lines[-20:]}")


def run(client: httpx.Client, session: httpx.Response, code: str) -> Stream:
    return execute(client, session.json()["id"], code, timeout=120)


CLASSIC_CODE = """\
import io, sys, matplotlib, pyarrow, scipy
import pandas as pd, numpy as np
from scipy.interpolate import interp2d
df = pd.DataFrame({'a': [1]}).append({'a': 2}, ignore_index=True)
parquet = io.BytesIO()
df.to_parquet(parquet)
same = pd.read_parquet(io.BytesIO(parquet.getvalue())).equals(df)
print(df['a'].tolist(), np.in1d([1], [1]).tolist(), callable(interp2d), same)
print(*(m.__version__ for m in (pd, np, scipy, matplotlib, pyarrow)))
print('%d.%d' % sys.version_info[:2])
"""
CHART_CODE = """\
import matplotlib.pyplot as plt
plt.plot([1, 3, 2]); plt.title('销售额')
"""
APPEND = "import pandas as pd\npd.DataFrame({'a': [1]}).append({'a': 2}, ignore_index=True)"
IN1D = "import numpy as np\nnp.in1d([1], [1])"


def test_python_classic_is_built_at_startup_and_runs_the_removed_apis(
    client: httpx.Client,
) -> None:
    started = time.monotonic()
    build, lines = built(client)
    took = time.monotonic() - started
    assert build["state"] == "ready", (build, lines[-30:])
    print(f"python-classic built in {took:.0f} s")
    assert any("pip download on the gateway's host" in line for line in lines), lines

    classic = client.post("/sessions", json={"template": CLASSIC})
    assert classic.status_code == 201, classic.text
    default = client.post("/sessions", json={})
    assert default.status_code == 201, default.text
    try:
        stream = run(client, classic, CLASSIC_CODE)
        assert stream.done["status"] == "ok", stream.events
        rows, versions, python = stream.stdout.splitlines()
        assert rows == "[1, 2] [True] True True"
        pandas, numpy, scipy, matplotlib, pyarrow = versions.split()
        print(f"python-classic: Python {python}, pandas {pandas}, NumPy {numpy}, "
              f"SciPy {scipy}, matplotlib {matplotlib}, pyarrow {pyarrow}")  # fmt: skip
        assert python == "3.11"
        assert pandas.startswith("1.5.") and numpy.startswith("1.26.")
        assert scipy.startswith("1.13.") and matplotlib.startswith("3.7.")
        chart = run(client, classic, CHART_CODE)
        assert chart.done["status"] == "ok", chart.events
        assert any("image/png" in d["data"] for d in chart.named("display")), chart.events
        assert "Glyph" not in "".join(d["text"] for d in chart.named("stderr"))

        for code, name in ((APPEND, "append"), (IN1D, "in1d")):  # removed in pandas 2, NumPy 2
            refused = run(client, default, code)
            assert refused.done["status"] == "error", (name, refused.events)
            error = refused.named("error")[0]
            assert error["ename"] == "AttributeError" and name in error["evalue"], error
    finally:
        client.delete(f"/sessions/{classic.json()['id']}")
        client.delete(f"/sessions/{default.json()['id']}")
    assert client.delete(f"/templates/{CLASSIC}").status_code == 204  # its 1.5 GB image too

"""What a backend copies into a container's folder for a program of `in_kernel/`
(`write_in_kernel_program`, from `in_kernel.PROGRAMS`): run from that folder alone, as the
container runs it, each program imports exactly the files listed for it and nothing of
the gateway. Only the docker backend runs these programs; this checks their files without
Docker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_gateway.in_kernel import PROGRAMS
from kernel_gateway.kernels.backends.base import write_in_kernel_program

IMPORTS = """\
import json, sys
folder = sys.argv[1]
sys.path.insert(0, folder)  # what `python <folder>/<program>.py` does
import {program}
print(json.dumps({{
    "beside": sorted(
        name for name, module in sys.modules.items()
        if (getattr(module, "__file__", None) or "").startswith(folder + "/")
    ),
    "gateway": sorted(name for name in sys.modules if name.startswith("kernel_gateway")),
}}))
"""


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_program_imports_the_files_written_beside_it_and_nothing_of_ours(
    tmp_path: Path, program: str
) -> None:
    script = write_in_kernel_program(tmp_path, program)
    assert script == tmp_path / f"{program}.py"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PROGRAMS[program])
    result = subprocess.run(
        [sys.executable, "-I", "-c", IMPORTS.format(program=program), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path.parent,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["beside"] == sorted(name.removesuffix(".py") for name in PROGRAMS[program])
    assert loaded["gateway"] == []


def test_the_bridge_starts_from_its_folder_as_the_container_starts_it(tmp_path: Path) -> None:
    script = write_in_kernel_program(tmp_path, "bridge")
    # as the container's command: `python /conn/bridge.py ...` (no -I or -P, which would
    # leave the script's folder off sys.path)
    result = subprocess.run(
        [sys.executable, "-E", str(script)], capture_output=True, text=True, cwd=tmp_path.parent
    )
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "usage: bridge.py CONNECTION_FILE KERNELSPEC",
    )


CHILD = """\
import json, socket, sys
sys.path.insert(0, sys.argv[1])
import zygote, fork_server, jupyter_wire, mini_kernel
import jupyter_client.session  # the fork server's preload has it

session = mini_kernel.stream_session()  # built in the fork server
before = set(sys.modules)
# a forked child: its key and stream, one request read, messages sent
ours, gateway = socket.socketpair()
wire = mini_kernel.Wire(ours)
session.start(b"key", wire)
request = session.msg("execute_request", {"code": "1"})
parts = [jupyter_client.session.json_packer(request[k]) for k in
         ("header", "parent_header", "metadata", "content")]
frames = jupyter_wire.serialize(parts, jupyter_wire.Signer(b"key"))
gateway.sendall(jupyter_wire.stream_record("shell", frames))
channel, received = wire.receive()
parent = session.read_request(received)["header"]
session.send("iopub", "status", {"execution_state": "busy"}, parent)
session.send(channel, "execute_reply", {"status": "ok"}, parent)
wire.drain()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_forked_childs_messages_import_nothing(tmp_path: Path) -> None:
    """What a child does on its stream (sign, frame, check) imports no module the fork server
    has not: the Docker tests check a whole cell (tests/integration/test_stateless.py)."""
    write_in_kernel_program(tmp_path, "zygote")
    result = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []

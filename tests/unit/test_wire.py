"""kernels/wire.py: the one copy of Jupyter's ZMQ signing and framing, checked against
jupyter_client's own Session (what real kernels use)."""

from __future__ import annotations

import pytest
from jupyter_client.session import Session as JupyterSession

from kernel_gateway.kernels.wire import (
    DELIM,
    BadMessage,
    Signer,
    deserialize,
    ipc_connection,
    pack_parts,
    serialize,
    socket_url,
    verified_parts,
)

KEY = "k" * 64


def test_a_message_signed_by_jupyter_client_verifies_and_parses() -> None:
    session = JupyterSession(key=KEY.encode(), signature_scheme="hmac-sha256")
    msg = session.msg("stream", {"name": "stdout", "text": "hi"})
    frames = session.serialize(msg, ident=[b"someone"])
    parsed = deserialize(frames, Signer(KEY))
    assert parsed["header"]["msg_type"] == "stream"
    assert parsed["content"] == {"name": "stdout", "text": "hi"}
    assert parsed["buffers"] == []


def test_what_the_gateway_signs_jupyter_client_accepts() -> None:
    session = JupyterSession(key=KEY.encode(), signature_scheme="hmac-sha256")
    msg = session.msg("execute_request", {"code": "1"})
    frames = serialize(pack_parts(msg, session.pack), Signer(KEY))
    assert frames == session.serialize(msg)
    idents, rest = session.feed_identities(frames)
    assert session.deserialize(rest)["content"] == {"code": "1"}


def test_tampered_unsigned_or_short_messages_are_refused() -> None:
    signer = Signer(KEY)
    parts = [b"{}", b"{}", b"{}", b"{}"]
    good = serialize(parts, signer)
    assert verified_parts(good, signer) == parts
    assert verified_parts([b"id", *good, b"buffer"], signer) == [*parts, b"buffer"]
    with pytest.raises(BadMessage, match="signature"):
        verified_parts([DELIM, good[1], b'{"x":1}', *parts[1:]], signer)
    with pytest.raises(BadMessage, match="signature"):
        verified_parts(good, Signer("other"))
    with pytest.raises(BadMessage, match="delimiter"):
        verified_parts(good[1:], signer)
    with pytest.raises(BadMessage, match="too few"):
        verified_parts(good[:-1], signer)
    with pytest.raises(BadMessage, match="too few"):
        verified_parts([DELIM], signer)


def test_deserialize_checks_the_shape_the_gateway_relies_on() -> None:
    signer = Signer(KEY)
    with pytest.raises(BadMessage, match="msg_type"):
        deserialize(serialize([b"{}", b"{}", b"{}", b"{}"], signer), signer)
    with pytest.raises(BadMessage, match="not an object"):
        deserialize(serialize([b"[]", b"{}", b"{}", b"{}"], signer), signer)
    with pytest.raises(ValueError):
        deserialize(serialize([b"not json", b"{}", b"{}", b"{}"], signer), signer)


def test_socket_urls() -> None:
    info = ipc_connection("/run/k")
    assert socket_url(info, "shell") == f"ipc:///run/k-{info['shell_port']}"
    assert socket_url(info, "iopub") == f"ipc:///run/k-{info['iopub_port']}"
    assert len(info["key"]) == 64 and info["signature_scheme"] == "hmac-sha256"
    assert ipc_connection("/run/k", key="abc")["key"] == "abc"
    tcp = {**info, "transport": "tcp", "ip": "127.0.0.1", "control_port": 5555}
    assert socket_url(tcp, "control") == "tcp://127.0.0.1:5555"  # type: ignore[arg-type]

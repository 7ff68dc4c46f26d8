"""kernels/wire.py and in_kernel/jupyter_wire.py: the one copy of Jupyter's signing and
framing, checked against jupyter_client's own Session (what real kernels use); the one
module the gateway, a forked stateless kernel (mini_kernel.py) and the bridge all use; and
the stream records a forked kernel reads and writes with it."""

from __future__ import annotations

import socket

import pytest
import zmq
from jupyter_client.session import Session as JupyterSession

from kernel_gateway.in_kernel import bridge, jupyter_wire, mini_kernel
from kernel_gateway.kernels import wire
from kernel_gateway.kernels.wire import (
    DELIM,
    MAX_MESSAGE_BYTES,
    RECORD_HEAD,
    BadMessage,
    Signer,
    deserialize,
    ipc_connection,
    oversized,
    pack_parts,
    record_frames,
    record_head,
    serialize,
    socket_url,
    stream_record,
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


# -- the stream of a forked stateless kernel ---------------------------------------------------


def _parse(stream: bytes) -> list[tuple[str, list[bytes]]]:
    records = []
    while stream:
        length, channel, count = record_head(stream[: RECORD_HEAD.size])
        body = stream[RECORD_HEAD.size : RECORD_HEAD.size + length]
        records.append((channel, record_frames(body, count)))
        stream = stream[RECORD_HEAD.size + length :]
    return records


def test_the_gateway_and_the_kernels_sign_and_frame_with_one_module() -> None:
    for name in ("DELIM", "Signer", "BadMessage", "serialize", "verified_parts"):
        assert getattr(wire, name) is getattr(jupyter_wire, name), name
    for name in ("RECORD_HEAD", "stream_record", "record_head", "record_frames"):
        assert getattr(wire, name) is getattr(jupyter_wire, name), name
    assert vars(mini_kernel)["jupyter_wire"] is jupyter_wire
    assert vars(bridge)["jupyter_wire"] is jupyter_wire


@pytest.mark.parametrize("channel", ["shell", "control", "iopub"])
def test_the_kernel_reads_the_records_the_gateway_writes(channel: str) -> None:
    frames = [DELIM, b"sig", b"{}", b"", b"\x00" * 70000, "é".encode()]
    assert _parse(stream_record(channel, frames) * 2) == [(channel, frames)] * 2
    left, right = socket.socketpair()
    with left, right:
        kernel = mini_kernel.Wire(left)
        right.sendall(stream_record(channel, frames) * 2)
        assert kernel.receive() == (channel, frames)
        assert kernel.receive() == (channel, frames)


def test_a_message_the_kernel_sends_on_its_stream_verifies() -> None:
    left, right = socket.socketpair()
    with left, right:
        session = mini_kernel.stream_session()
        session.start(KEY.encode(), mini_kernel.Wire(left))
        session.send("iopub", "stream", {"name": "stdout", "text": "hi"}, {"msg_id": "m"})
        data = right.recv(65536)
    [(channel, frames)] = _parse(data)
    msg = deserialize(frames, Signer(KEY))
    assert channel == "iopub"
    assert msg["content"] == {"name": "stdout", "text": "hi"}
    assert msg["parent_header"] == {"msg_id": "m"}


def test_the_kernel_reads_only_requests_signed_with_its_key() -> None:
    session = mini_kernel.stream_session()
    left, right = socket.socketpair()
    with left, right:
        session.start(KEY.encode(), mini_kernel.Wire(left))
        gateway = JupyterSession(key=KEY.encode(), signature_scheme="hmac-sha256")
        request = gateway.msg("execute_request", {"code": "1"})
        parsed = session.read_request(gateway.serialize(request, ident=[b"x"]))
        assert parsed["content"] == {"code": "1"}
        assert parsed["header"]["msg_id"] == request["header"]["msg_id"]
        other = JupyterSession(key=b"other", signature_scheme="hmac-sha256")
        with pytest.raises(ValueError):
            session.read_request(other.serialize(request))


def test_records_that_do_not_add_up_are_refused() -> None:
    record = stream_record("shell", [b"abc", b"de"])
    length, _, count = record_head(record[: RECORD_HEAD.size])
    body = record[RECORD_HEAD.size :]
    with pytest.raises(BadMessage):
        record_frames(body[:-1], count)  # ends inside a frame
    with pytest.raises(BadMessage):
        record_frames(body + b"x", count)  # bytes after the frames
    with pytest.raises(BadMessage):
        record_frames(body, count + 1)  # ends inside a frame size
    with pytest.raises(BadMessage):
        record_head(b"\x00\x00\x00\x01x\x00\x01")  # no such channel
    assert oversized(record_head(RECORD_HEAD.pack(MAX_MESSAGE_BYTES + 1, b"i", 1))[0])
    assert not oversized(length)
    assert length == len(body)


def test_a_request_the_bridge_signs_verifies() -> None:
    context = zmq.Context()
    kernel = context.socket(zmq.ROUTER)
    info = {"key": KEY, "signature_scheme": "hmac-sha256"}
    requester = bridge.Requester(info, "inproc://control", context)
    try:
        kernel.setsockopt(zmq.RCVTIMEO, 5000)
        kernel.bind("inproc://control")
        msg_id = requester.send("interrupt_request")
        _identity, *frames = kernel.recv_multipart()
        msg = deserialize(frames, Signer(KEY))
        assert msg["header"]["msg_id"] == msg_id
        assert msg["header"]["msg_type"] == "interrupt_request"
        jupyter = JupyterSession(key=KEY.encode(), signature_scheme="hmac-sha256")
        assert jupyter.deserialize(frames[1:])["msg_type"] == "interrupt_request"
        with pytest.raises(BadMessage, match="signature"):
            deserialize(frames, Signer("other"))
    finally:
        kernel.close(linger=0)
        requester.socket.close(linger=0)
        context.term()

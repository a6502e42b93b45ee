"""Connect-RPC's JSON codec as the edge speaks it: the envelopes of a server stream (unit), and bad
input over the wire of a live edge answered in Connect's shape naming the field, never a 500."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import httpx
import pytest

from e2b import Sandbox
from paddock_controlplane.edge.e2b.edge import connect
from tests.e2b.conftest import E2bPlatform


def test_envelopes_round_trip() -> None:
    data = connect.envelope({"event": {"start": {"pid": 7}}}) + connect.end_of_stream()
    assert data[:5] == struct.pack(">BI", 0, len(b'{"event":{"start":{"pid":7}}}'))
    assert connect.read_envelopes(data) == [(0, {"event": {"start": {"pid": 7}}}), (2, {})]
    failed = connect.end_of_stream(connect.ConnectError("not_found", "process with pid 9 not found"))
    assert connect.read_envelopes(failed) == [
        (2, {"error": {"code": "not_found", "message": "process with pid 9 not found"}})
    ]
    assert connect.stream_request(connect.envelope({"path": "/tmp"})) == {"path": "/tmp"}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_argument"),  # no envelope
        (struct.pack(">BI", 1, 2) + b"{}", "unimplemented"),  # compressed
        (struct.pack(">BI", 0, 9) + b"{}", "invalid_argument"),  # length does not match
        (struct.pack(">BI", 0, 2) + b"[]", "invalid_argument"),  # not an object
    ],
)
def test_bad_stream_requests(body: bytes, code: str) -> None:
    with pytest.raises(connect.ConnectError) as refused:
        connect.stream_request(body)
    assert refused.value.code == code


@pytest.fixture(scope="module")
def envd(e2b_env: E2bPlatform) -> Iterator[tuple[httpx.Client, Sandbox]]:
    sandbox = Sandbox.create(timeout=300)
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or "",
    }
    try:
        with httpx.Client(base_url=e2b_env.sandbox_url, headers=headers, timeout=30) as client:
            yield client, sandbox
    finally:
        sandbox.kill()


@pytest.mark.root
@pytest.mark.slow
def test_bad_input_is_a_connect_error_naming_the_field(envd: tuple[httpx.Client, Sandbox]) -> None:
    client, _ = envd
    unary = {"Content-Type": "application/json"}
    stream = {"Content-Type": "application/connect+json"}

    empty = client.post("/filesystem.Filesystem/Stat", json={"path": ""}, headers=unary)
    assert (empty.status_code, empty.json()) == (
        400,
        {"code": "invalid_argument", "message": "path: is required"},
    )
    missing = client.post("/filesystem.Filesystem/Stat", json={"path": "/nope"}, headers=unary)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    garbage = client.post("/process.Process/List", content=b"{not json", headers=unary)
    assert garbage.status_code == 400 and garbage.json()["code"] == "invalid_argument"
    signal = client.post(
        "/process.Process/SendSignal", json={"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"}, headers=unary
    )
    assert signal.status_code in (400, 404)  # pid 1 is not a managed process, or the signal is refused
    unknown = client.post("/process.Process/StreamInput", json={}, headers=unary)
    assert unknown.status_code == 501 and unknown.json()["code"] == "unimplemented"
    depth = client.post("/filesystem.Filesystem/ListDir", json={"path": "/", "depth": 1000}, headers=unary)
    assert depth.status_code == 400 and depth.json()["message"].startswith("depth:")

    no_cmd = client.post(
        "/process.Process/Start", content=connect.envelope({"process": {"args": []}}), headers=stream
    )
    assert no_cmd.status_code == 200  # a stream's error travels in its end envelope
    assert connect.read_envelopes(no_cmd.content) == [
        (2, {"error": {"code": "invalid_argument", "message": "process.cmd: must be a string"}})
    ]
    big = client.post(
        "/process.Process/Start",
        content=connect.envelope({"process": {"cmd": "x" * (connect.MAX_MESSAGE_BYTES + 10)}}),
        headers=stream,
    )
    end = connect.read_envelopes(big.content)[-1]
    assert end[0] == 2 and end[1]["error"]["code"] == "resource_exhausted"

    started = client.post(
        "/process.Process/Start",
        content=connect.envelope({"process": {"cmd": "/bin/echo", "args": ["wire"]}}),
        headers=stream,
    )
    messages = connect.read_envelopes(started.content)
    assert "pid" in messages[0][1]["event"]["start"]
    out = [m["event"]["data"]["stdout"] for f, m in messages if f == 0 and "data" in m.get("event", {})]
    assert out == ["d2lyZQo="]  # "wire\n", base64 as proto JSON's bytes
    assert messages[-2][1]["event"]["end"] == {"exitCode": 0, "exited": True, "status": "exit status 0"}
    assert messages[-1] == (2, {})


@pytest.mark.root
@pytest.mark.slow
def test_users_by_basic_auth(envd: tuple[httpx.Client, Sandbox]) -> None:
    client, sandbox = envd
    as_root = sandbox.commands.run("id -un", user="root")
    assert as_root.stdout == "root\n"
    stranger = client.post(
        "/process.Process/List",
        json={},
        headers={"Content-Type": "application/json", "Authorization": "Basic bWFsbG9yeTo="},  # mallory:
    )
    assert stranger.status_code == 400 and "mallory" in json.loads(stranger.text)["message"]

"""Bad input answered with a 4xx naming the field, never a 5xx, and the connection stays usable (issue #12).

Every probe goes through a kept-alive connection and is followed by a request on that *same* connection
(same local port) that must succeed: a 500 used to make uvicorn drop the connection, so the next request
of a client that did nothing wrong failed with ECONNRESET.

The live probes run against the real platform (control-plane and host-agent processes, real sandboxes);
the in-process ones against a real uvicorn server on 127.0.0.1, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.http import RequestContextMiddleware
from paddock_hostagent.middleware import RequestLogMiddleware
from tests.conftest import LiveServer
from tests.controlplane.conftest import ControlPlane, controlplane, cp_settings
from tests.gateway.conftest import Gateway, gateway, new_wallet
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform
from tests.terminals.conftest import live

__all__ = ["controlplane", "cp_settings", "debian_image", "gateway", "guest_binary_dir", "live"]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size
DEEP = b"[" * 50_000 + b"]" * 50_000
TWO_63 = 2**63

pytestmark = [pytest.mark.root, pytest.mark.slow]


# -- helpers ---------------------------------------------------------------------------------------


def local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried ``response``."""
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


def assert_fail(response: httpx.Response, status: int, code: str, field: str) -> dict[str, Any]:
    """A JSend fail envelope (§4) with ``code`` and a reason under ``field``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status"] == "fail", body
    assert body["data"]["code"] == code, body
    assert isinstance(body["data"].get(field), str) and body["data"][field], body
    return dict(body["data"])


def then_ok(http: httpx.Client, bad: httpx.Response, path: str = "/v1/whoami") -> None:
    """The next request on the same kept-alive connection succeeds."""
    follow = http.get(path)
    assert follow.status_code == 200, follow.text
    assert local_port(follow) == local_port(bad), "the server dropped the connection"


async def athen_ok(http: httpx.AsyncClient, bad: httpx.Response, path: str, **kwargs: Any) -> None:
    follow = await http.get(path, **kwargs)
    assert follow.status_code == 200, follow.text
    assert local_port(follow) == local_port(bad), "the server dropped the connection"


# -- the live platform ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http(live: LivePlatform) -> Iterator[httpx.Client]:
    with live.http(live.api_key()) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox_id(http: httpx.Client) -> Iterator[str]:
    created = http.post("/v1/sandboxes", json={"shape": SHAPE, "disk_mib": DISK_MIB, "envs": {"FOO": "x"}})
    assert created.status_code == 200, created.text
    sid = str(created.json()["data"]["id"])
    yield sid
    http.delete(f"/v1/sandboxes/{sid}")


LISTS = ["/v1/sandboxes", "/v1/networks", "/v1/webhook-endpoints", "/v1/hosts", "/v1/shapes"]


@pytest.mark.parametrize("path", LISTS)
def test_list_offset_of_2_63_is_400_and_limit_is_clamped(http: httpx.Client, path: str) -> None:
    bad = http.get(path, params={"offset": TWO_63})
    data = assert_fail(bad, 400, "VALIDATION_FAILED", "offset")
    assert data["offset"] == f"must be at most {2**31 - 1}"
    then_ok(http, bad)
    # §8.2: a limit above 500 is clamped, however large; one that is no integer at all is a 400.
    huge = http.get(path, params={"limit": TWO_63})
    assert huge.status_code == 200 and huge.json()["data"]["pagination"]["limit"] == 500
    assert_fail(http.get(path, params={"limit": "9" * 5000}), 400, "VALIDATION_FAILED", "limit")


def test_recharge_of_2_63_bytes_is_400(http: httpx.Client, sandbox_id: str) -> None:
    bad = http.post(f"/v1/sandboxes/{sandbox_id}/bandwidth/recharge", json={"add_bytes": TWO_63})
    assert_fail(bad, 400, "VALIDATION_FAILED", "add_bytes")
    then_ok(http, bad)
    for field, value in (("disk_mib", TWO_63), ("bandwidth_quota_bytes", TWO_63)):
        bad = http.post("/v1/sandboxes", json={"shape": SHAPE, field: value})
        assert_fail(bad, 400, "VALIDATION_FAILED", field)
        then_ok(http, bad)


# Both lanes of exec: a buffered exec is served by the fast lane (which hands a body it refuses to the
# route), ``?stream=true`` goes to the FastAPI route directly.
LANES = [{}, {"stream": "true"}]


@pytest.mark.parametrize("query", LANES, ids=["fast-lane", "route"])
def test_nul_in_exec_is_400_naming_the_field(
    http: httpx.Client, sandbox_id: str, query: dict[str, str]
) -> None:
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    cases = [
        ({"cmd": "echo", "args": ["ok", "a\x00b"]}, "args[1]"),
        ({"cmd": "ec\x00ho"}, "cmd"),
        ({"cmd": "env", "env": {"FOO": "a\x00b"}}, "env.FOO"),
    ]
    for body, field in cases:
        bad = http.post(url, json=body, params=query)
        assert_fail(bad, 400, "VALIDATION_FAILED", field)
        then_ok(http, bad, f"/v1/sandboxes/{sandbox_id}")
    # and the sandbox still runs commands; stdin is bytes for the command, where NUL is data
    done = http.post(url, json={"cmd": "od", "args": ["-An", "-c"], "stdin": "a\x00b"})
    assert done.status_code == 200, done.text
    assert done.json()["data"]["result"]["stdout"].split() == ["a", "\\0", "b"]


def test_nul_in_env_is_refused_at_create(http: httpx.Client) -> None:
    bad = http.post("/v1/sandboxes", json={"shape": SHAPE, "envs": {"BAD": "a\x00b"}})
    assert_fail(bad, 400, "VALIDATION_FAILED", "envs.BAD")
    then_ok(http, bad)
    for body, field in (
        ({"url": "http://127.0.0.1:9/\x00hook"}, "url"),
        ({"name": "net\x00work"}, "name"),
    ):
        path = "/v1/webhook-endpoints" if "url" in body else "/v1/networks"
        bad = http.post(path, json=body)
        assert_fail(bad, 400, "VALIDATION_FAILED", field)
        then_ok(http, bad)


@pytest.mark.parametrize("query", LANES, ids=["fast-lane", "route"])
def test_nan_infinity_and_deep_json_are_400(
    http: httpx.Client, sandbox_id: str, query: dict[str, str]
) -> None:
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    for raw, field in (
        (b'{"cmd": "true", "extra": NaN}', "extra"),
        (b'{"cmd": "true", "args": [], "n": {"x": -Infinity}}', "n.x"),
        (b'{"cmd": "true", "n": 1e999}', "n"),
        (DEEP, "body"),
    ):
        bad = http.post(url, content=raw, params=query, headers={"Content-Type": "application/json"})
        data = assert_fail(bad, 400, "VALIDATION_FAILED", field)
        assert "NaN" in data[field] or "nested" in data[field]
        then_ok(http, bad, f"/v1/sandboxes/{sandbox_id}")


def test_deep_json_and_nan_on_other_routes(http: httpx.Client, sandbox_id: str) -> None:
    """A route with a body model declared to FastAPI (create) and one with an optional body (PATCH)."""
    for method, path in (("POST", "/v1/sandboxes"), ("PATCH", f"/v1/sandboxes/{sandbox_id}")):
        bad = http.request(method, path, content=DEEP, headers={"Content-Type": "application/json"})
        assert_fail(bad, 400, "VALIDATION_FAILED", "body")
        then_ok(http, bad)
    bad = http.post("/v1/sandboxes", content=b'{"shape": "s-1vcpu-256mb", "disk_mib": NaN}')
    assert_fail(bad, 400, "VALIDATION_FAILED", "disk_mib")
    then_ok(http, bad)


@pytest.mark.parametrize("query", LANES, ids=["fast-lane", "route"])
def test_exec_command_over_the_limit_is_413(
    http: httpx.Client, sandbox_id: str, query: dict[str, str]
) -> None:
    args = ["x" * 100_000] * 45  # 4.5 MB: over the guest agent's 4 MiB exec request
    bad = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "true", "args": args}, params=query)
    data = assert_fail(bad, 413, "PAYLOAD_TOO_LARGE", "args")
    assert "stdin" in data["args"]
    then_ok(http, bad, f"/v1/sandboxes/{sandbox_id}")
    # the advice holds: the same bytes go through stdin
    piped = http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "wc", "args": ["-c"], "stdin": "".join(args)}
    )
    assert piped.status_code == 200 and piped.json()["data"]["result"]["stdout"].strip() == "4500000"


def test_buffered_output_is_capped_and_says_so(http: httpx.Client, sandbox_id: str) -> None:
    script = "head -c 6000000 /dev/zero | tr '\\0' a; echo done >&2; exit 7"
    done = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "sh", "args": ["-c", script]})
    assert done.status_code == 200, done.text[:300]
    result = done.json()["data"]["result"]
    # the command ran to its end (its exit code is real); stdout kept its first 4 MiB
    assert result["exit_code"] == 7 and "error" not in result
    assert result["stdout"] == "a" * (4 << 20) and result["stdout_truncated"] is True
    assert result["stderr"] == "done\n" and "stderr_truncated" not in result
    # a stream carries everything
    with http.stream(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/exec",
        params={"stream": "true"},
        json={"cmd": "sh", "args": ["-c", script]},
    ) as stream:
        frames = [json.loads(line) for line in stream.iter_lines() if line.strip()]
    assert sum(len(f.get("stdout", "")) for f in frames) == 6_000_000
    assert frames[-1] == {"exit_code": 7}


FILE_CASES = [
    ("/root/" + "n" * 256, "component"),
    ("/root/" + "/".join(["d" * 200] * 25), "shorter"),
    ("/dev/null", "regular file"),
    ("/proc/sys/kernel/hostname", "pseudo filesystem"),
    ("/proc/1/fd/2", "/proc/1/fd/2"),  # a pipe or the agent's log: either way not for uploads
    ("/sys/kernel/notes", "pseudo filesystem"),
    ("/run/paddock-guest", "/run/paddock-guest"),  # the guest agent's own bind mount
]


@pytest.mark.parametrize(("path", "reason"), FILE_CASES, ids=[c[1] + ":" + c[0][:20] for c in FILE_CASES])
def test_file_paths_that_cannot_be_written_are_400(
    http: httpx.Client, sandbox_id: str, path: str, reason: str
) -> None:
    bad = http.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": path}, content=b"x" * 64)
    data = assert_fail(bad, 400, "VALIDATION_FAILED", "path")
    assert reason in data["path"], data
    then_ok(http, bad, f"/v1/sandboxes/{sandbox_id}")


def test_put_creates_missing_parent_directories(http: httpx.Client, sandbox_id: str) -> None:
    put = http.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/root/fresh/a/b/notes.txt"}, content=b"hi"
    )
    assert put.status_code == 200, put.text
    assert put.json()["data"] == {"path": "/root/fresh/a/b/notes.txt", "size": 2}
    got = http.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/root/fresh/a/b/notes.txt"})
    assert got.status_code == 200 and got.content == b"hi"
    modes = http.post(
        f"/v1/sandboxes/{sandbox_id}/exec",
        json={"cmd": "stat", "args": ["-c", "%a", "/root/fresh", "/root/fresh/a/b"]},
    )
    assert modes.json()["data"]["result"]["stdout"] == "755\n755\n"
    # a parent that is a file is the caller's mistake (§11.6)
    bad = http.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/root/fresh/a/b/notes.txt/x"}, content=b"hi"
    )
    assert_fail(bad, 400, "VALIDATION_FAILED", "path")
    then_ok(http, bad)


# §12.1 (access tokens), §12.2 (processes) and §12.3 (computer use) are implemented:
# tests/controlplane/resources/test_access_tokens.py, tests/terminals/, tests/desktop/. On a sandbox that was not
# booted from a desktop image, computer use is a 409 (§12.3), whatever the body.
SECTION_12_3 = [
    ("GET", "computer/screenshot"),
    ("PUT", "computer/clipboard"),
    ("POST", "computer/mouse/click"),
    ("POST", "computer/keyboard/type"),
    ("GET", "computer/windows/123/geometry"),
    ("POST", "computer/windows/123/focus"),
    ("GET", "computer/screens"),
    ("POST", "computer/screens/screen-0/resize"),
]


def test_computer_use_on_a_sandbox_without_a_desktop_is_409(http: httpx.Client, sandbox_id: str) -> None:
    for method, suffix in SECTION_12_3:
        body = {"text": "x"} if method == "PUT" or suffix.endswith("type") else None
        answer = http.request(method, f"/v1/sandboxes/{sandbox_id}/{suffix}", json=body)
        assert_fail(answer, 409, "INVALID_STATE", "code")
        assert "desktop" in answer.json()["data"]["message"]
    # a method §12 does not list on such a path is a 405, as anywhere else
    wrong = http.request("PATCH", f"/v1/sandboxes/{sandbox_id}/computer/screenshot")
    assert_fail(wrong, 405, "METHOD_NOT_ALLOWED", "code")
    then_ok(http, wrong)


# -- in process: PostgreSQL and SQLite, forced 500s -------------------------------------------------


async def test_nul_never_reaches_the_database(controlplane: ControlPlane) -> None:
    """On PostgreSQL a NUL in text was a 500 (invalid byte sequence 0x00); now it is a 400 on both."""
    _, key = await controlplane.new_user()
    headers = {"X-Api-Key": key}
    http = controlplane.http
    for path, body, field in (
        ("/v1/webhook-endpoints", {"url": "https://example.com/\x00"}, "url"),
        ("/v1/networks", {"name": "n\x00"}, "name"),
        ("/v1/sandboxes", {"shape": "s-1vcpu-1gb", "name": "a\x00"}, "name"),
    ):
        bad = await http.post(path, json=body, headers=headers)
        assert bad.status_code == 400, bad.text
        assert bad.json()["data"]["code"] == "VALIDATION_FAILED" and field in bad.json()["data"]
        await athen_ok(http, bad, "/v1/whoami", headers=headers)
    listed = await http.get("/v1/webhook-endpoints", headers=headers)
    assert listed.json()["data"]["pagination"]["total"] == 0  # nothing half-written
    # path and query parameters too (GET /v1/sandboxes/{id} is the fast lane's; it hands NUL on)
    for method, path, field in (
        ("GET", "/v1/sandboxes/sb-%00", "sandbox_id"),
        ("POST", "/v1/sandboxes/sb-%00/exec", "sandbox_id"),
        ("GET", "/v1/sandboxes?status=run%00", "status"),
        ("GET", "/v1/networks/n%00", "network_id"),
        ("DELETE", "/v1/webhook-endpoints/w%00", "endpoint_id"),
    ):
        bad = await http.request(
            method, path, headers=headers, json={"cmd": "true"} if method == "POST" else None
        )
        assert bad.status_code == 400, (path, bad.text)
        assert bad.json()["data"]["code"] == "VALIDATION_FAILED" and field in bad.json()["data"], bad.text
        await athen_ok(http, bad, "/v1/whoami", headers=headers)


@pytest.fixture
async def failing_controlplane(cp_settings: ControlPlaneSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The real control-plane app with one extra route that fails as a bug would."""
    await migrate(cp_settings)
    app = create_app(cp_settings)

    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url) as http:
        yield http


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
async def test_a_500_keeps_the_connection(failing_controlplane: httpx.AsyncClient) -> None:
    http = failing_controlplane
    for _ in range(3):
        bad = await http.get("/boom")
        assert bad.status_code == 500
        body = bad.json()
        assert body["status"] == "error" and body["code"] == 500
        assert bad.headers["x-request-id"] in body["message"]  # the id to quote; no traceback
        assert "a bug" not in bad.text
        await athen_ok(http, bad, "/healthz")


async def test_a_500_keeps_the_host_agents_connection() -> None:
    """The host agent's request middleware answers an unexpected exception with the app's handler."""
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.exception_handler(Exception)
    async def unexpected(_: Any, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": "internal", "message": "internal error"}, 500)

    app.add_middleware(RequestLogMiddleware)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url) as http:
        bad = await http.get("/boom")
        assert bad.status_code == 500 and bad.json() == {"error": "internal", "message": "internal error"}
        await athen_ok(http, bad, "/healthz")
    plain = FastAPI()  # no handler of its own: the JSend error envelope
    plain.add_api_route("/boom", boom)
    plain.add_api_route("/healthz", healthz)
    plain.add_middleware(RequestContextMiddleware, service="test")
    async with LiveServer(plain) as server, httpx.AsyncClient(base_url=server.url) as http:
        bad = await http.get("/boom")
        assert bad.status_code == 500 and bad.json()["status"] == "error" and bad.json()["code"] == 500
        await athen_ok(http, bad, "/healthz")


# -- the gateway ------------------------------------------------------------------------------------


async def test_gateway_refuses_nul_nan_and_deep_json(gateway: Gateway) -> None:
    wallet = new_wallet()
    http = gateway.http
    for raw, code, field in (
        (DEEP, "invalid_body", "body"),
        (b'{"uniqueName": "a\\u0000b"}', "invalid_body", "uniqueName"),
        (b'{"uniqueName": "ab", "months": NaN}', "invalid_body", "months"),
    ):
        headers = {**gateway.auth(wallet), "Content-Type": "application/json"}
        bad = await http.post("/agent/deploy", content=raw, headers=headers)
        assert bad.status_code == 400, bad.text
        body = bad.json()
        assert body["code"] == code and body["details"][0]["field"] == field, body
        await athen_ok(http, bad, "/health")

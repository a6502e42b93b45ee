"""E2B's ``network.allowPublicTraffic`` on Paddock's ingress, through the unmodified ``e2b`` SDK: the URL
``sandbox.get_host(port)`` names answers anyone when the sandbox was made with public traffic, and only
a request carrying the sandbox's ``e2b-traffic-access-token`` when it was made without (or, Paddock's
default, with nothing said). Each request goes to the real ingress's listener on 127.0.0.1 with the
SDK's host name in ``Host``, as a browser reaching ``https://<host>`` would (the test platform's ingress
speaks plain HTTP)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx
import pytest

from e2b import Sandbox
from tests.e2b.conftest import E2bPlatform
from tests.network.ingress_support import APP

pytestmark = pytest.mark.root

PORT = 8080


def through_ingress(host: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GET /hello of ``<port>-<id>.<domain>``, sent to the ingress's listener at 127.0.0.1."""
    listener = urlsplit(f"http://{host}").port
    assert listener is not None, host  # the test platform's ingress has a port of its own
    return httpx.get(
        f"http://127.0.0.1:{listener}/hello", headers={"Host": host, **(headers or {})}, timeout=30
    )


def serve_app(sandbox: Sandbox) -> str:
    """Starts the test app on PORT in the sandbox; its host name once it answers (through the edge)."""
    sandbox.files.write("/srv/app.pl", APP.read_bytes())
    sandbox.commands.run(f"exec perl /srv/app.pl {PORT}", background=True, timeout=0).disconnect()
    probe = "for i in $(seq 100); do perl -MIO::Socket::INET -e 'exit !IO::Socket::INET->new(\"127.0.0.1:%d\")' && exit 0; sleep 0.1; done; exit 1"
    assert sandbox.commands.run(probe % PORT).exit_code == 0
    return sandbox.get_host(PORT)


def test_public_traffic_opens_the_sandbox_url_to_anyone(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(network={"allow_public_traffic": True}, timeout=120)
    try:
        host = serve_app(sandbox)
        answer = through_ingress(host)
        assert answer.status_code == 200 and answer.text.startswith("hello from "), answer.text
        # a wrong token is refused even where none is needed: it is not this sandbox's
        wrong = through_ingress(host, {"e2b-traffic-access-token": "ea_" + "0" * 64})
        assert wrong.status_code == 403, wrong.text
        with e2b_env.platform.http(e2b_env.api_key) as api:  # the same switch /v1 shows
            assert api.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]["ingress_enabled"] is True
    finally:
        sandbox.kill()


@pytest.mark.parametrize("network", [{"allow_public_traffic": False}, None], ids=["false", "unset"])
def test_without_public_traffic_the_url_needs_the_traffic_token(
    e2b_env: E2bPlatform, network: dict[str, bool] | None
) -> None:
    sandbox = Sandbox.create(network=network, timeout=120)  # type: ignore[arg-type]
    try:
        host = serve_app(sandbox)
        refused = through_ingress(host)
        assert refused.status_code == 404, refused.text
        assert refused.headers["x-paddock-ingress-error"] == "INGRESS_DISABLED"
        assert sandbox.traffic_access_token
        answer = through_ingress(host, {"e2b-traffic-access-token": sandbox.traffic_access_token})
        assert answer.status_code == 200 and answer.text.startswith("hello from "), answer.text
        other = Sandbox.create(timeout=60)
        try:  # another sandbox's token opens nothing here
            assert other.traffic_access_token and other.traffic_access_token != sandbox.traffic_access_token
            wrong = through_ingress(host, {"e2b-traffic-access-token": other.traffic_access_token})
            assert (
                wrong.status_code == 403
                and wrong.headers["x-paddock-ingress-error"] == "TRAFFIC_TOKEN_REFUSED"
            )
        finally:
            other.kill()
    finally:
        sandbox.kill()


def test_mask_request_host_is_the_host_the_sandbox_app_gets(e2b_env: E2bPlatform) -> None:
    """E2B's ``network.maskRequestHost``: the app behind ``get_host(port)`` sees the mask, with
    ``${PORT}`` its port, in ``Host`` (a dev server that checks its host name answers); a fork keeps it,
    ``get_info`` shows it, and a mask that is no host is a 400 naming the field."""
    mask = "${PORT}-myapp.example.test"
    sandbox = Sandbox.create(network={"allow_public_traffic": True, "mask_request_host": mask}, timeout=120)
    try:
        host = serve_app(sandbox)
        answer = through_ingress(host)
        assert answer.status_code == 200 and answer.text.startswith("hello from "), answer.text
        assert answer.headers["x-seen-host"] == f"{PORT}-myapp.example.test"
        # The same through E2B's sandbox listener, which also serves a sandbox's ports.
        by_edge = httpx.get(
            f"{e2b_env.sandbox_url}/hello",
            headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(PORT)},
            timeout=30,
        )
        assert by_edge.status_code == 200 and by_edge.headers["x-seen-host"] == f"{PORT}-myapp.example.test"
        assert (sandbox.get_info().network or {}).get("mask_request_host") == mask
        (child,) = sandbox.fork(timeout=120)
        assert isinstance(child, Sandbox), child
        try:  # a fork starts its processes afresh (docs/e2b.md): its app again, with its source's mask
            child_host = serve_app(child)
            assert through_ingress(child_host).headers["x-seen-host"] == f"{PORT}-myapp.example.test"
            assert (child.get_info().network or {}).get("mask_request_host") == mask
        finally:
            child.kill()
        plain = Sandbox.create(network={"allow_public_traffic": True}, timeout=120)
        try:  # without a mask, the app sees the host the client named
            plain_host = serve_app(plain)
            assert through_ingress(plain_host).headers["x-seen-host"] == plain_host
            assert "mask_request_host" not in (plain.get_info().network or {})
        finally:
            plain.kill()
    finally:
        sandbox.kill()
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60) as api:
        for bad in ("my app.example.test", "x.example.test\r\nX-Evil: 1", "${HOST}.example.test", "a" * 256):
            body = {"templateID": "base", "network": {"maskRequestHost": bad}}
            answer = api.post("/v2/sandboxes", json=body)
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["message"].startswith("network.maskRequestHost"), answer.text


TLS_PORT = 8443
#: A self-signed certificate made in the sandbox, and openssl's own HTTPS server on TLS_PORT (``-www``
#: answers a GET with a status page that names the TLS session it came over).
SERVE_HTTPS = (
    "cd /tmp && openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=app -days 1 -keyout k.pem -out c.pem"
    f" 2>/dev/null && exec openssl s_server -quiet -accept {TLS_PORT} -www -cert c.pem -key k.pem"
)


def test_https_ports_are_reached_over_tls(e2b_env: E2bPlatform) -> None:
    """E2B's ``network.httpsPorts``: the ingress reaches an app that serves HTTPS itself (its
    certificate self-signed) over TLS; the client speaks plain HTTP to the ingress here, as a browser
    would speak HTTPS to E2B's. A port not listed is reached in plain HTTP, which such an app refuses."""
    sandbox = Sandbox.create(network={"allow_public_traffic": True, "https_ports": [TLS_PORT]}, timeout=120)
    try:
        sandbox.commands.run(SERVE_HTTPS, background=True, timeout=0).disconnect()
        host = sandbox.get_host(TLS_PORT)
        deadline = time.monotonic() + 30
        while (answer := through_ingress(host)).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert answer.status_code == 200 and "Cipher" in answer.text, answer.text[:300]
        assert (sandbox.get_info().network or {}).get("https_ports") == [TLS_PORT]
        by_edge = httpx.get(
            f"{e2b_env.sandbox_url}/",
            headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(TLS_PORT)},
            timeout=30,
        )
        assert by_edge.status_code == 200 and "Cipher" in by_edge.text, by_edge.text[:300]
    finally:
        sandbox.kill()
    plain = Sandbox.create(network={"allow_public_traffic": True}, timeout=120)
    try:
        plain.commands.run(SERVE_HTTPS, background=True, timeout=0).disconnect()
        host = plain.get_host(TLS_PORT)
        deadline = time.monotonic() + 30
        while (answer := through_ingress(host)).status_code == 502 and time.monotonic() < deadline:
            if "NOTHING_LISTENING" not in answer.headers.get("x-paddock-ingress-error", ""):
                break
            time.sleep(0.3)
        # The app listens, and plain HTTP to it gets no page: the TLS above was the ingress's doing.
        assert answer.headers.get("x-paddock-ingress-error") != "NOTHING_LISTENING", answer.text[:300]
        assert answer.status_code == 502 and "Cipher" not in answer.text, (answer.headers, answer.text[:300])
    finally:
        plain.kill()
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60) as api:
        for bad, field in (
            ([49983], "network.httpsPorts[0]"),
            ([443, 0], "network.httpsPorts[1]"),
            (["443"], "network.httpsPorts[0]"),
            (list(range(1, 40)), "network.httpsPorts"),
        ):
            answer = api.post("/v2/sandboxes", json={"templateID": "base", "network": {"httpsPorts": bad}})
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["message"].startswith(field), answer.text


def test_unserved_network_fields_are_501_naming_them(e2b_env: E2bPlatform) -> None:
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60) as api:
        body = {"templateID": "base", "network": {"allowPublicTraffic": True, "rules": {"example.test": []}}}
        answer = api.post("/v2/sandboxes", json=body)
        assert answer.status_code == 501, answer.text
        assert answer.json()["message"].startswith("network.rules:"), answer.text
        typed = api.post(
            "/v2/sandboxes", json={"templateID": "base", "network": {"allowPublicTraffic": "yes"}}
        )
        assert typed.status_code == 400 and "allowPublicTraffic" in typed.json()["message"], typed.text

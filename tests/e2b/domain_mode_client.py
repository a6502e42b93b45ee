"""An E2B program run by ``test_domain_mode.py`` in a process of its own, as a user runs one: its
environment (``E2B_API_URL``, ``E2B_API_KEY``, ``SSL_CERT_FILE``, no ``E2B_SANDBOX_URL``) is set before
it starts, since the SDK's envd client reads its trusted certificates once, at its first use.

``*.<domain>`` resolves to 127.0.0.1, as a DNS record for it would (the one stand-in: the SDK is
unchanged). It prints one JSON object of what it saw; the test module asserts on it.

    python domain_mode_client.py DOMAIN
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.parse
from typing import Any

DOMAIN = sys.argv[1]
_resolve = socket.getaddrinfo


def _wildcard_record(host: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, str) and host.endswith("." + DOMAIN):
        host = "127.0.0.1"
    return _resolve(host, *args, **kwargs)


socket.getaddrinfo = _wildcard_record  # type: ignore[assignment]

import httpx  # noqa: E402
from e2b_code_interpreter import Sandbox as CodeSandbox  # noqa: E402

from e2b import Sandbox  # noqa: E402


def _with(url: str, **changes: str | None) -> str:
    """``url`` with query parameters changed (None: removed)."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _answer(response: httpx.Response) -> list[Any]:
    """[status, envd's error message, or the body as text]."""
    try:
        body = response.json()
    except ValueError:
        body = None
    message = body.get("message", "") if isinstance(body, dict) else response.text
    return [response.status_code, message]


def main() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    sandbox = Sandbox.create(timeout=300)
    try:
        seen["envd_url"] = sandbox.envd_api_url
        seen["sandbox_id"] = sandbox.sandbox_id
        seen["run"] = sandbox.commands.run("echo $((6 * 7))").stdout  # a server-streaming Connect call
        sandbox.files.write("/tmp/domain.txt", "through the ingress")
        seen["read"] = sandbox.files.read("/tmp/domain.txt")
        seen["listed"] = [entry.name for entry in sandbox.files.list("/tmp") if entry.name == "domain.txt"]

        # Signed URLs, used by someone without the token (a browser, another service).
        sandbox.files.write("/tmp/shared.txt", "signed for you")
        read = sandbox.download_url("/tmp/shared.txt", use_signature_expiration=120)
        write = sandbox.upload_url("/tmp/uploaded.txt")
        signature = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(read).query))["signature"]
        with httpx.Client(verify=os.environ["SSL_CERT_FILE"], timeout=30) as anyone:
            seen["signed_read"] = _answer(anyone.get(read))
            seen["signed_write"] = _answer(
                anyone.post(write, files={"file": ("uploaded.txt", b"sent without a token")})
            )
            seen["uploaded"] = sandbox.files.read("/tmp/uploaded.txt")
            seen["refused"] = {
                "another path": _answer(anyone.get(_with(read, path="/etc/shadow"))),
                "a later expiration": _answer(
                    anyone.get(_with(read, signature_expiration=str(int(time.time()) + 999)))
                ),
                "a changed signature": _answer(
                    anyone.get(_with(read, signature=signature[:-1] + ("A" if signature[-1] != "A" else "B")))
                ),
                "a write's signature read": _answer(anyone.get(write)),
                "expired": _answer(
                    anyone.get(sandbox.download_url("/tmp/shared.txt", use_signature_expiration=-1))
                ),
                "unsigned": _answer(anyone.get(_with(read, signature=None, signature_expiration=None))),
            }
    finally:
        sandbox.kill()

    code = CodeSandbox.create(timeout=300)
    try:
        seen["interpreter_url"] = code.envd_api_url
        seen["run_code"] = code.run_code("x = 6 * 7\nx").text  # https://49999-<id>.<domain>/execute
    finally:
        code.kill()
    return seen


if __name__ == "__main__":
    print(json.dumps(main()))

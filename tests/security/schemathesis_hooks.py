"""schemathesis hooks for ``test_schemathesis.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

Three of four generated cases get real ids for their path parameters (from ``PDK_ST_IDS``, JSON), so
requests reach the code behind the 404; the fourth keeps schemathesis' own value to fuzz the lookup.
Operations that end or stop a sandbox get a sandbox of their own, so the rest keep a running one;
file operations work beneath a tree of the test's (``FILES_ROOT``).
Gateway requests are signed per case with the test wallet (``PDK_ST_WALLET_KEY``), as a client does
(gateway spec §3), except the fourth, whose generated auth headers test the 401 path. One check of
its own holds every 503 to the contract's two meanings of it (schemathesis.toml).
"""

from __future__ import annotations

import json
import os
import time
import uuid
import zlib
from typing import Any

import schemathesis
from eth_account import Account
from eth_account.messages import encode_defunct

from paddock_controlplane.hosts.hostlink import SANDBOX_BUSY
from paddock_controlplane.hosts.scheduler import NO_CAPACITY

#: Operations that would leave the shared sandbox destroyed or paused for the others.
STOPPING = {
    ("DELETE", "/v1/sandboxes/{sandbox_id}"),
    ("POST", "/v1/sandboxes/{sandbox_id}/pause"),
    ("POST", "/v1/sandboxes/{sandbox_id}/resume"),
}
AUTH_HEADERS = ("X-Wallet-Address", "X-Signature", "X-Timestamp", "X-Nonce")
#: A small tree the test makes in the shared sandbox. The file operations' generated absolute paths go
#: under it, so a fuzzed remove, rename or tar meets that tree and not the sandbox's system (a tar of
#: ``/`` packs the whole root file system; a rename of ``/usr`` would break every later operation);
#: the generated text (NUL, length, components) still reaches the validation whole, and a value that
#: is not absolute is sent as generated, for its 400.
FILES_ROOT = "/tmp/st-files"
#: A watch streams until its client leaves (up to an hour), which a check that reads the whole answer
#: cannot end: its paths go under a directory that does not exist, so the sandbox looks and the answer
#: is the 404. Its stream is tested in tests/sdk/test_live_files_async.py.
ABSENT_ROOT = "/tmp/st-absent"
WATCH = "/v1/sandboxes/{sandbox_id}/files/watch"
PATH_QUERY = ("path", "source", "destination")

#: ``PUT …/files/tar`` takes a tar as raw bytes; schemathesis sends it as it sends an octet stream.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


def fuzzed(value: Any) -> bool:
    """A stable one-in-four choice from the generated value itself (reruns pick the same cases)."""
    return zlib.crc32(repr(value).encode()) % 4 == 0


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    ids: dict[str, str] = json.loads(os.environ.get("PDK_ST_IDS", "{}"))
    key = (case.method.upper(), case.operation.path)
    for name in list(case.path_parameters or {}):
        if name in ids and not fuzzed(case.path_parameters[name]):
            real = ids["victim_sandbox_id"] if key in STOPPING and name == "sandbox_id" else ids[name]
            case.path_parameters[name] = real
    query = case.query or {}
    if case.operation.path.startswith("/v1/sandboxes/{sandbox_id}/files"):
        root = ABSENT_ROOT if case.operation.path == WATCH else FILES_ROOT
        for name in PATH_QUERY:
            value = query.get(name)
            if isinstance(value, str) and value.startswith("/"):
                query[name] = root + value
    if "wait_ms" in query or "wait_for" in query:
        # A long poll holds its answer up to 30 s by design; 0.2 s proves the same code paths.
        query["wait_ms"] = 200
    wallet_key = os.environ.get("PDK_ST_WALLET_KEY")
    declared = {p.name for p in case.operation.headers}
    if wallet_key and set(AUTH_HEADERS) <= declared and not fuzzed(case.headers):
        case.headers = {**(case.headers or {}), **signed_headers(wallet_key)}
    return case


@schemathesis.check
def a_503_is_a_retryable_capacity_or_busy_answer(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> None:
    """The two 503s the contract has (schemathesis.toml lets them past ``not_a_server_error``): the
    control plane's "no host with capacity", or a sandbox too busy for more requests now (its guest
    takes no more connections), each in the error envelope with a ``Retry-After`` the SDKs sleep for."""
    if response.status_code != 503:
        return
    body = response.json()
    assert isinstance(body, dict) and body.get("status") == "error", f"503 outside the error envelope: {body}"
    message = str(body.get("message", ""))
    assert message.startswith(NO_CAPACITY) or message == SANDBOX_BUSY, (
        f"a 503 that is neither capacity nor busy: {body}"
    )
    assert response.headers.get("retry-after"), "a capacity or busy 503 without Retry-After"


def signed_headers(private_key: str) -> dict[str, str]:
    account = Account.from_key(private_key)
    address, timestamp, nonce = str(account.address), str(int(time.time() * 1000)), str(uuid.uuid4())
    signature = account.sign_message(encode_defunct(text=f"{address}:{timestamp}:{nonce}")).signature
    return dict(zip(AUTH_HEADERS, (address, "0x" + bytes(signature).hex(), timestamp, nonce), strict=True))

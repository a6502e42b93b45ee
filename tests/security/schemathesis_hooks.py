"""schemathesis hooks for ``test_schemathesis.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

Three of four generated cases get real ids for their path parameters (from ``PDK_ST_IDS``, JSON), so
requests reach the code behind the 404; the fourth keeps schemathesis' own value to fuzz the lookup.
Operations that end or stop a sandbox get a sandbox of their own, so the rest keep a running one.
Gateway requests are signed per case with the test wallet (``PDK_ST_WALLET_KEY``), as a client does
(gateway spec §3), except the fourth, whose generated auth headers test the 401 path.
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

#: Operations that would leave the shared sandbox destroyed or paused for the others.
STOPPING = {
    ("DELETE", "/v1/sandboxes/{sandbox_id}"),
    ("POST", "/v1/sandboxes/{sandbox_id}/pause"),
    ("POST", "/v1/sandboxes/{sandbox_id}/resume"),
}
AUTH_HEADERS = ("X-Wallet-Address", "X-Signature", "X-Timestamp", "X-Nonce")


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
    if "wait_ms" in query or "wait_for" in query:
        # A long poll holds its answer up to 30 s by design; 0.2 s proves the same code paths.
        query["wait_ms"] = 200
    wallet_key = os.environ.get("PDK_ST_WALLET_KEY")
    declared = {p.name for p in case.operation.headers}
    if wallet_key and set(AUTH_HEADERS) <= declared and not fuzzed(case.headers):
        case.headers = {**(case.headers or {}), **signed_headers(wallet_key)}
    return case


def signed_headers(private_key: str) -> dict[str, str]:
    account = Account.from_key(private_key)
    address, timestamp, nonce = str(account.address), str(int(time.time() * 1000)), str(uuid.uuid4())
    signature = account.sign_message(encode_defunct(text=f"{address}:{timestamp}:{nonce}")).signature
    return dict(zip(AUTH_HEADERS, (address, "0x" + bytes(signature).hex(), timestamp, nonce), strict=True))

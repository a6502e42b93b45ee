"""One lifetime and one label set (issue #33): a sandbox made through the unmodified ``e2b`` SDK shows
its ``timeout`` and ``metadata`` in ``/v1`` (``timeout_s``, ``end_at``, ``metadata``, ``?metadata.k=v``),
and one made through ``/v1`` shows its lifetime and labels to the SDK; a timeout set through either is
the other's ``end_at``, enforced by the reconciler's expiry pass alone. On the previous code the E2B
API kept its own tables, so each API saw none of the other's (``metadata`` null in ``/v1``, ``{}`` and a
9999 ``endAt`` in E2B)."""

from __future__ import annotations

import datetime as dt
import secrets
import time

import pytest

from e2b import NotFoundException, Sandbox, SandboxQuery
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_e2b_lifetime_and_metadata_are_v1s_and_back(e2b_env: E2bPlatform) -> None:
    tag = secrets.token_hex(4)
    sandbox = Sandbox.create(metadata={"suite": tag, "via": "e2b"}, timeout=120)
    native_id = None
    with e2b_env.platform.http(e2b_env.api_key) as http:
        try:
            view = http.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
            assert view["metadata"] == {"suite": tag, "via": "e2b"}
            assert view["timeout_s"] == 120 and view["on_timeout"] == "destroy"
            left = (_when(view["end_at"]) - dt.datetime.now(dt.UTC)).total_seconds()
            assert 90 < left <= 121, left
            listed = http.get("/v1/sandboxes", params={"metadata.suite": tag, "metadata.via": "e2b"})
            assert [item["id"] for item in listed.json()["data"]["data"]] == [sandbox.sandbox_id]

            # /v1 -> E2B: labels and a lifetime set natively read through the SDK.
            made = http.post(
                "/v1/sandboxes",
                json={"shape": "s-1vcpu-1gb", "timeout_s": 200, "metadata": {"suite": tag, "via": "v1"}},
            )
            assert made.status_code in (200, 201), made.text
            native_id = made.json()["data"]["id"]
            deadline = time.monotonic() + 60
            while http.get(f"/v1/sandboxes/{native_id}").json()["data"]["status"] != "running":
                assert time.monotonic() < deadline, "the /v1 sandbox did not run within 60 s"
                time.sleep(0.5)
            info = Sandbox.get_info(native_id)
            assert info.metadata == {"suite": tag, "via": "v1"}
            left = (info.end_at - dt.datetime.now(dt.UTC)).total_seconds()
            assert 150 < left <= 201, left
            found = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "via": "v1"})).next_items()
            assert [item.sandbox_id for item in found] == [native_id]

            # A timeout set through E2B is /v1's end_at, and /v1's through E2B.
            Sandbox.set_timeout(native_id, 2)
            view = http.get(f"/v1/sandboxes/{native_id}").json()["data"]
            assert (_when(view["end_at"]) - dt.datetime.now(dt.UTC)).total_seconds() <= 3, view
            shorter = http.post(f"/v1/sandboxes/{sandbox.sandbox_id}/timeout", json={"timeout_s": 2})
            assert shorter.status_code == 200, shorter.text
            assert (sandbox.get_info().end_at - dt.datetime.now(dt.UTC)).total_seconds() <= 3
            # Both go by the native expiry pass (the E2B listener has no worker of its own any more).
            deadline = time.monotonic() + 30
            gone: set[str] = set()
            while gone != {sandbox.sandbox_id, native_id}:
                assert time.monotonic() < deadline, f"only {gone} went within 30 s of their timeout"
                for sandbox_id in (sandbox.sandbox_id, native_id):
                    try:
                        Sandbox.get_info(sandbox_id)
                    except NotFoundException:
                        gone.add(sandbox_id)
                time.sleep(0.5)
            for sandbox_id in gone:
                status = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]["status"]
                assert status in ("destroying", "destroyed"), status
        finally:
            Sandbox.kill(sandbox.sandbox_id)
            if native_id is not None:
                http.delete(f"/v1/sandboxes/{native_id}")

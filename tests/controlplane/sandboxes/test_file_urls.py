"""A signed file link opens one path of one sandbox for one operation until its expiry
(``sandboxes/file_urls.py``); the live test is tests/sdk/test_live_files_async.py."""

from __future__ import annotations

from paddock_controlplane.sandboxes import file_urls

SECRET = "test-secret-key-0123456789"
NOW = 1_800_000_000.0
EXPIRES = int(NOW) + 60


def _refusal(
    method: str = "GET",
    *,
    sandbox_id: str = "sb-1",
    path: str = "/root/a.txt",
    expires: str = str(EXPIRES),
    secret: str = SECRET,
    now: float = NOW,
) -> str | None:
    signed = file_urls.query(SECRET, "sb-1", "read", "/root/a.txt", EXPIRES)
    return file_urls.refusal(secret, sandbox_id, method, path, expires, signed["signature"], now)


def test_a_link_opens_its_path_for_its_operation_until_it_expires() -> None:
    assert _refusal() is None
    assert _refusal(now=EXPIRES) is None  # the last second still opens it
    assert _refusal(now=EXPIRES + 1) == "the signed URL has expired"


def test_anything_else_is_refused_and_says_why() -> None:
    wrong = "signature: not this server's for this sandbox, path, operation and expiry"
    assert _refusal(sandbox_id="sb-2") == wrong
    assert _refusal(path="/root/b.txt") == wrong
    assert _refusal("PUT") == wrong  # a read link does not write
    assert _refusal(expires=str(EXPIRES + 3600)) == wrong  # a longer life is not this link's
    assert _refusal(secret="another-server") == wrong
    assert _refusal("DELETE") == "a signed URL does not open DELETE"
    for bad in ("", "-1", "1e9", "１２", "9" * 13):
        assert _refusal(expires=bad) == "expires: must be a Unix time in seconds"


def test_a_write_link_opens_put_only() -> None:
    signed = file_urls.query(SECRET, "sb-1", "write", "/root/in.csv", EXPIRES)
    assert set(signed) == {"path", "expires", "signature"} and signed["path"] == "/root/in.csv"
    assert (
        file_urls.refusal(SECRET, "sb-1", "PUT", "/root/in.csv", str(EXPIRES), signed["signature"], NOW)
        is None
    )
    assert file_urls.refusal(SECRET, "sb-1", "GET", "/root/in.csv", str(EXPIRES), signed["signature"], NOW)

"""``Client``: the synchronous twin of :class:`paddock.AsyncClient`, method for method."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from paddock import _base
from paddock._errors import TransportError, WaitTimeoutError
from paddock._models import ExecResult, SandboxInfo

WAIT_ABORT = frozenset({"error", "failed", "destroying", "destroyed"})


def _sb(sandbox_id: str, *rest: str) -> str:
    return "/".join(["v1/sandboxes", quote(sandbox_id, safe=""), *rest])


class Client:
    """``with Client() as client: sb = client.sandboxes.create("s-1vcpu-1gb")``."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retry: _base.RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url, key = _base.resolve(base_url, api_key)
        self._http = httpx.Client(
            base_url=url,
            headers=_base.headers(key),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )
        self.retry = retry or _base.RetryPolicy()
        self.sandboxes = Sandboxes(self)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                resp = self._http.request(method, path.lstrip("/"), **kwargs)
            except httpx.TransportError as exc:
                if not self.retry.should_retry(method, None, attempt):
                    raise TransportError(str(exc) or type(exc).__name__) from exc
                time.sleep(self.retry.delay_s(attempt))
                attempt += 1
                continue
            if resp.status_code >= 400 and self.retry.should_retry(method, resp.status_code, attempt):
                time.sleep(self.retry.delay_s(attempt, resp.headers.get("retry-after")))
                attempt += 1
                continue
            return _base.unwrap(resp)

    def paginate(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Any]:
        offset = 0
        while True:
            page = self.request("GET", path, params={**(params or {}), "limit": 500, "offset": offset})
            items = page.get("data", []) if isinstance(page, dict) else list(page or [])
            yield from items
            offset += len(items)
            total = page.get("pagination", {}).get("total") if isinstance(page, dict) else None
            if not items or total is None or offset >= total:
                return

    def whoami(self) -> dict[str, Any]:
        return dict(self.request("GET", "v1/whoami"))

    def shapes(self) -> list[dict[str, Any]]:
        return list(self.paginate("v1/shapes"))

    def rootfs(self) -> dict[str, Any]:
        return dict(self.request("GET", "v1/rootfs"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandboxes:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, shape: str, **fields: Any) -> Sandbox:
        data = self._client.request("POST", "v1/sandboxes", json=_base.drop_none({"shape": shape, **fields}))
        return Sandbox(self._client, SandboxInfo.from_api(data))

    def get(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self._client, SandboxInfo.from_api(self._client.request("GET", _sb(sandbox_id))))

    def list(self, status: str | None = None) -> list[SandboxInfo]:
        params = {"status": status} if status else None
        return [SandboxInfo.from_api(item) for item in self._client.paginate("v1/sandboxes", params)]


class Sandbox:
    """A handle on one sandbox. ``with`` destroys it on exit."""

    def __init__(self, client: Client, info: SandboxInfo) -> None:
        self._client = client
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def refresh(self) -> SandboxInfo:
        self.info = SandboxInfo.from_api(self._client.request("GET", _sb(self.id)))
        return self.info

    def wait_until(self, status: str, timeout_s: float = 120.0) -> SandboxInfo:
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            info = self.refresh()
            if info.status == status:
                return info
            if info.status in WAIT_ABORT and not (status == "destroyed" and info.status == "destroying"):
                raise RuntimeError(f"sandbox {self.id} is {info.status}, not {status}")
            if time.monotonic() >= deadline:
                raise WaitTimeoutError(f"sandbox {self.id} did not reach {status} in {timeout_s}s")
            time.sleep(delay)
            delay = min(2.0, delay * 1.5)

    def run(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        body = _base.drop_none({"cmd": cmd, "args": list(args), "env": env, "stdin": stdin})
        return ExecResult.from_api(self._client.request("POST", _sb(self.id, "exec"), json=body))

    def stream(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        body = _base.drop_none({"cmd": cmd, "args": list(args), "env": env, "stdin": stdin, "stream": True})
        with self._client._http.stream(
            "POST", _sb(self.id, "exec"), params={"stream": "true"}, json=body
        ) as resp:
            if resp.status_code >= 400:
                _base.raise_for_error(resp, resp.read())
            for line in resp.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def write_file(self, path: str, data: bytes | Iterator[bytes]) -> dict[str, Any]:
        return dict(
            self._client.request(
                "PUT",
                _sb(self.id, "files"),
                params={"path": path},
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
        )

    def read_file(self, path: str) -> bytes:
        return b"".join(self.iter_file(path))

    def iter_file(self, path: str) -> Iterator[bytes]:
        with self._client._http.stream("GET", _sb(self.id, "files"), params={"path": path}) as resp:
            if resp.status_code >= 400:
                _base.raise_for_error(resp, resp.read())
            yield from resp.iter_bytes()

    def pause(self) -> SandboxInfo:
        self.info = SandboxInfo.from_api(self._client.request("POST", _sb(self.id, "pause")))
        return self.info

    def resume(self) -> SandboxInfo:
        self.info = SandboxInfo.from_api(self._client.request("POST", _sb(self.id, "resume")))
        return self.info

    def fork(self, **overrides: Any) -> Sandbox:
        data = self._client.request("POST", _sb(self.id, "fork"), json=_base.drop_none(overrides))
        return Sandbox(self._client, SandboxInfo.from_api(data))

    def resize(self, disk_mib: int) -> int:
        return int(
            self._client.request("POST", _sb(self.id, "resize"), json={"disk_mib": disk_mib})["disk_mib"]
        )

    def destroy(self) -> str:
        return str(self._client.request("DELETE", _sb(self.id))["status"])

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

"""``AsyncClient``: the control-plane API over httpx's async client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any

import httpx

from paddock import _base
from paddock._errors import TransportError, WaitTimeoutError
from paddock._models import ExecResult, SandboxInfo

WAIT_ABORT = frozenset({"error", "failed", "destroying", "destroyed"})


class AsyncClient:
    """``async with AsyncClient() as client: sb = await client.sandboxes.create("s-1vcpu-1gb")``.

    Base URL and key come from the arguments or ``PADDOCK_BASE_URL`` / ``PADDOCK_API_KEY``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retry: _base.RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url, key = _base.resolve(base_url, api_key)
        self._http = httpx.AsyncClient(
            base_url=url,
            headers=_base.headers(key),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )
        self.retry = retry or _base.RetryPolicy()
        self.sandboxes = AsyncSandboxes(self)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call with the retry policy; returns the JSend ``data``."""
        attempt = 0
        while True:
            try:
                resp = await self._http.request(method, path.lstrip("/"), **kwargs)
            except httpx.TransportError as exc:
                if not self.retry.should_retry(method, None, attempt):
                    raise TransportError(str(exc) or type(exc).__name__) from exc
                await asyncio.sleep(self.retry.delay_s(attempt))
                attempt += 1
                continue
            if resp.status_code >= 400 and self.retry.should_retry(method, resp.status_code, attempt):
                await asyncio.sleep(self.retry.delay_s(attempt, resp.headers.get("retry-after")))
                attempt += 1
                continue
            return _base.unwrap(resp)

    async def paginate(self, path: str, params: dict[str, Any] | None = None) -> AsyncIterator[Any]:
        """Every item of a paginated list, advancing by the items received until ``total``."""
        offset = 0
        while True:
            page = await self.request("GET", path, params={**(params or {}), "limit": 500, "offset": offset})
            items = page.get("data", []) if isinstance(page, dict) else list(page or [])
            for item in items:
                yield item
            offset += len(items)
            total = page.get("pagination", {}).get("total") if isinstance(page, dict) else None
            if not items or total is None or offset >= total:
                return

    async def whoami(self) -> dict[str, Any]:
        return dict(await self.request("GET", "v1/whoami"))

    async def shapes(self) -> list[dict[str, Any]]:
        return [s async for s in self.paginate("v1/shapes")]

    async def rootfs(self) -> dict[str, Any]:
        return dict(await self.request("GET", "v1/rootfs"))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSandboxes:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, shape: str, **fields: Any) -> AsyncSandbox:
        """Create and return once ``running`` (the POST waits); destroyed again if a later wait fails."""
        data = await self._client.request(
            "POST", "v1/sandboxes", json=_base.drop_none({"shape": shape, **fields})
        )
        return AsyncSandbox(self._client, SandboxInfo.from_api(data))

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(
            self._client, SandboxInfo.from_api(await self._client.request("GET", _sb(sandbox_id)))
        )

    async def list(self, status: str | None = None) -> list[SandboxInfo]:
        params = {"status": status} if status else None
        return [SandboxInfo.from_api(item) async for item in self._client.paginate("v1/sandboxes", params)]


def _sb(sandbox_id: str, *rest: str) -> str:
    from urllib.parse import quote

    return "/".join(["v1/sandboxes", quote(sandbox_id, safe=""), *rest])


class AsyncSandbox:
    """A handle on one sandbox. ``async with`` destroys it on exit."""

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
        self._client = client
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def refresh(self) -> SandboxInfo:
        self.info = SandboxInfo.from_api(await self._client.request("GET", _sb(self.id)))
        return self.info

    async def wait_until(self, status: str, timeout_s: float = 120.0) -> SandboxInfo:
        """Poll adaptively (250 ms growing to 2 s) until ``status``; raise on a terminal state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = 0.05
        while True:
            info = await self.refresh()
            if info.status == status:
                return info
            if info.status in WAIT_ABORT and not (status == "destroyed" and info.status == "destroying"):
                raise RuntimeError(f"sandbox {self.id} is {info.status}, not {status}")
            if loop.time() >= deadline:
                raise WaitTimeoutError(f"sandbox {self.id} did not reach {status} in {timeout_s}s")
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 1.5)

    async def run(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        body = _base.drop_none({"cmd": cmd, "args": list(args), "env": env, "stdin": stdin})
        return ExecResult.from_api(await self._client.request("POST", _sb(self.id, "exec"), json=body))

    async def stream(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield NDJSON frames (``stdout``, ``stderr``, ``hb``, ``error``, and a last ``exit_code``)."""
        body = _base.drop_none({"cmd": cmd, "args": list(args), "env": env, "stdin": stdin, "stream": True})
        async with self._client._http.stream(
            "POST", _sb(self.id, "exec"), params={"stream": "true"}, json=body
        ) as resp:
            if resp.status_code >= 400:
                _base.raise_for_error(resp, await resp.aread())
            async for line in resp.aiter_lines():
                line = line.strip()
                if line:
                    yield json.loads(line)

    async def write_file(self, path: str, data: bytes | AsyncIterator[bytes]) -> dict[str, Any]:
        return dict(
            await self._client.request(
                "PUT",
                _sb(self.id, "files"),
                params={"path": path},
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
        )

    async def read_file(self, path: str) -> bytes:
        chunks = [c async for c in self.iter_file(path)]
        return b"".join(chunks)

    async def iter_file(self, path: str) -> AsyncIterator[bytes]:
        async with self._client._http.stream("GET", _sb(self.id, "files"), params={"path": path}) as resp:
            if resp.status_code >= 400:
                _base.raise_for_error(resp, await resp.aread())
            async for chunk in resp.aiter_bytes():
                yield chunk

    async def pause(self) -> SandboxInfo:
        self.info = SandboxInfo.from_api(await self._client.request("POST", _sb(self.id, "pause")))
        return self.info

    async def resume(self) -> SandboxInfo:
        self.info = SandboxInfo.from_api(await self._client.request("POST", _sb(self.id, "resume")))
        return self.info

    async def fork(self, **overrides: Any) -> AsyncSandbox:
        data = await self._client.request("POST", _sb(self.id, "fork"), json=_base.drop_none(overrides))
        return AsyncSandbox(self._client, SandboxInfo.from_api(data))

    async def resize(self, disk_mib: int) -> int:
        return int(
            (await self._client.request("POST", _sb(self.id, "resize"), json={"disk_mib": disk_mib}))[
                "disk_mib"
            ]
        )

    async def destroy(self) -> str:
        return str((await self._client.request("DELETE", _sb(self.id)))["status"])

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.destroy()

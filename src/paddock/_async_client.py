"""``AsyncClient``: the control-plane API over httpx, its plain JSON calls on ``paddock._wire``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from paddock import _base, _blocking, _wire
from paddock._async_resources import (
    AsyncDisks,
    AsyncNetworks,
    AsyncSnapshots,
    AsyncTemplates,
    AsyncVolumes,
    AsyncWebhooks,
)
from paddock._async_sandbox import AsyncSandbox, AsyncSandboxes
from paddock._errors import ConflictError, TransportError
from paddock._models import AccountMetrics, HostInfo, RootfsData, SandboxInfo, Shape, WhoAmI


class AsyncClient:
    """``async with AsyncClient() as client: sb = await client.sandboxes.create("s-1vcpu-1gb")``.

    Base URL and key come from the arguments or ``PADDOCK_BASE_URL`` / ``PADDOCK_API_KEY``; the base URL
    defaults to ``http://127.0.0.1:8080``. ``timeout`` bounds connect, each read, write and pool wait.

    A paused sandbox answers exec, files and processes with a 409 (the API never wakes it: §11.5).
    With ``auto_resume=True`` such a 409 resumes the sandbox, waits until it runs, and sends the call
    once more (a call whose body cannot be sent again, a streamed upload, still raises the 409).

    Resources, one attribute each:

    - ``sandboxes`` (:class:`AsyncSandboxes`): ``create``, ``get``, ``list``, ``iter``, ``by_ip``; the
      :class:`AsyncSandbox` handles they return run commands, move files, pause, fork and destroy.
    - ``templates`` (:class:`AsyncTemplates`): Dockerfiles built into images that sandboxes boot.
    - ``snapshots`` (:class:`AsyncSnapshots`): copies of a sandbox's disk that boot new sandboxes.
    - ``volumes`` (:class:`AsyncVolumes`): local persistent volumes that outlive their sandboxes.
    - ``disks`` (:class:`AsyncDisks`): S3 buckets registered once, mounted into sandboxes.
    - ``networks`` (:class:`AsyncNetworks`): private overlay networks between sandboxes.
    - ``webhooks`` (:class:`AsyncWebhooks`): endpoints that receive signed events.

    Account and catalog reads: ``whoami()``, ``shapes()``, ``rootfs()``, ``hosts()``.
    """

    sandboxes: AsyncSandboxes
    templates: AsyncTemplates
    snapshots: AsyncSnapshots
    volumes: AsyncVolumes
    disks: AsyncDisks
    networks: AsyncNetworks
    webhooks: AsyncWebhooks
    base_url: str
    auto_resume: bool
    retry: _base.RetryPolicy

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retry: _base.RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        auto_resume: bool = False,
    ) -> None:
        url, key = _base.resolve(base_url, api_key)
        self.auto_resume = auto_resume
        self.base_url = url
        self._http = httpx.AsyncClient(
            base_url=url,
            headers=_base.headers(key),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
            # Under the control plane's keep-alive, as the direct path's (``_wire.IDLE_REUSE_S``): httpx
            # keeps an idle connection as long as the server does, 5 s, so a call could race its close.
            limits=httpx.Limits(keepalive_expiry=_wire.IDLE_REUSE_S),
        )
        # Plain JSON calls skip httpx (~0.45 ms of CPU each) where nothing httpx does is needed: an
        # ``http://`` base URL with no proxy, and no transport of the caller's own (see ``_wire``).
        origin = None if transport is not None else _wire.origin_for(url)
        self._wire = None if origin is None else _wire.AsyncWire(origin, _base.headers(key), timeout)
        self.retry = retry or _base.RetryPolicy()
        self.sandboxes = AsyncSandboxes(self)
        self.webhooks = AsyncWebhooks(self)
        self.networks = AsyncNetworks(self)
        self.disks = AsyncDisks(self)
        self.templates = AsyncTemplates(self)
        self.snapshots = AsyncSnapshots(self)
        self.volumes = AsyncVolumes(self)

    async def request(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> Any:
        """One API call under the retry policy (``retry=False`` for one-shot bodies); returns JSend ``data``."""
        try:
            return await self._request(method, path, retry=retry, **kwargs)
        except ConflictError as exc:
            sandbox_id = _base.paused_sandbox(path, exc) if self.auto_resume and retry else None
            if sandbox_id is None:
                raise
        await self._resume(sandbox_id)
        return await self._request(method, path, retry=retry, **kwargs)

    async def _resume(self, sandbox_id: str) -> None:
        """``auto_resume``: resume a paused sandbox and wait until it runs (resumed meanwhile: waited for)."""
        info = await self._request("GET", _base.path("sandboxes", sandbox_id))
        sandbox = AsyncSandbox(self, SandboxInfo.from_api(info))
        try:
            await sandbox.resume()
        except ConflictError:  # someone else resumed it first
            await sandbox.wait_until("running")

    async def _request(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                if self._wire is not None and _wire.accepts(kwargs):
                    resp = await self._wire.request(method, path, kwargs)
                else:
                    resp = await self._http.request(method, path.lstrip("/"), **kwargs)
            except httpx.TransportError as exc:
                if not (retry and self.retry.should_retry(method, None, attempt)):
                    raise TransportError(
                        f"cannot reach the server at {self.base_url}: {str(exc) or type(exc).__name__}"
                    ) from exc
                await _blocking.asleep(self.retry.delay_s(attempt))
                attempt += 1
                continue
            if (
                retry
                and resp.status_code >= 400
                and self.retry.should_retry(method, resp.status_code, attempt)
            ):
                await _blocking.asleep(self.retry.delay_s(attempt, resp.headers.get("retry-after")))
                attempt += 1
                continue
            return _base.unwrap(resp)

    async def open_stream(self, method: str, path: str, **kwargs: Any) -> Any:
        """A streamed response (never retried); an error status raises the typed error at once."""
        try:
            return await self._open_stream(method, path, **kwargs)
        except ConflictError as exc:
            resendable = "content" not in kwargs  # a streamed upload's body is gone
            sandbox_id = _base.paused_sandbox(path, exc) if self.auto_resume and resendable else None
            if sandbox_id is None:
                raise
        await self._resume(sandbox_id)
        return await self._open_stream(method, path, **kwargs)

    async def _open_stream(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = await self._http.send(self._http.build_request(method, path, **kwargs), stream=True)
        except httpx.TransportError as exc:
            raise TransportError(
                f"cannot reach the server at {self.base_url}: {str(exc) or type(exc).__name__}"
            ) from exc
        if resp.status_code >= 400:
            try:
                _base.raise_for_error(resp, await resp.aread())
            finally:
                await resp.aclose()
        return resp

    async def paginate(
        self, path: str, params: dict[str, Any] | None = None, *, page_size: int = 500
    ) -> AsyncIterator[Any]:
        """Every item of a paginated list: ``offset`` advances by the items received until ``total``."""
        offset = 0
        while True:
            page = await self.request(
                "GET", path, params={**(params or {}), "limit": page_size, "offset": offset}
            )
            items, total = _base.page_items(page)
            for item in items:
                yield item
            offset += len(items)
            if not items or total is None or offset >= total:
                return

    async def whoami(self) -> WhoAmI:
        """The key's user (``user_id``) and how many of its sandboxes run (``stats``)."""
        return WhoAmI.from_api(await self.request("GET", "v1/whoami"))

    async def shapes(self) -> list[Shape]:
        """The shapes a sandbox can have (``id`` is what ``create`` takes)."""
        return [Shape.from_api(s) async for s in self.paginate("v1/shapes")]

    async def rootfs(self) -> RootfsData:
        """The catalog images a sandbox can boot and the default one."""
        return RootfsData.from_api(await self.request("GET", "v1/rootfs"))

    async def metrics(self) -> AccountMetrics:
        """The account's use now, summed over its running sandboxes' newest samples
        (docs/observability.md); a sandbox's own series is ``sandbox.metrics()``."""
        return AccountMetrics.from_api(await self.request("GET", "v1/metrics"))

    async def hosts(self) -> list[HostInfo]:
        """The hosts sandboxes are placed on, with their free memory and sandbox count."""
        return [HostInfo.from_api(h) async for h in self.paginate("v1/hosts")]

    async def aclose(self) -> None:
        if self._wire is not None:
            await self._wire.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["AsyncClient", "AsyncSandbox", "AsyncSandboxes"]

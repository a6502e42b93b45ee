"""``Client``: the control-plane API over httpx, synchronous. ``AsyncClient`` is its awaited twin."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from paddock import _base
from paddock._errors import TransportError
from paddock._resources import Networks, Webhooks
from paddock._sandbox import Sandbox, Sandboxes


class Client:
    """``with Client() as client: sb = client.sandboxes.create("s-1vcpu-1gb")``.

    Base URL and key come from the arguments or ``PADDOCK_BASE_URL`` / ``PADDOCK_API_KEY``; the base URL
    defaults to ``http://127.0.0.1:8080``. ``timeout`` bounds connect, each read, write and pool wait.
    """

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
        self.base_url = url
        self._http = httpx.Client(
            base_url=url,
            headers=_base.headers(key),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )
        self.retry = retry or _base.RetryPolicy()
        self.sandboxes = Sandboxes(self)
        self.webhooks = Webhooks(self)
        self.networks = Networks(self)

    def request(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> Any:
        """One API call under the retry policy (``retry=False`` for one-shot bodies); returns JSend ``data``."""
        attempt = 0
        while True:
            try:
                resp = self._http.request(method, path.lstrip("/"), **kwargs)
            except httpx.TransportError as exc:
                if not (retry and self.retry.should_retry(method, None, attempt)):
                    raise TransportError(str(exc) or type(exc).__name__) from exc
                time.sleep(self.retry.delay_s(attempt))
                attempt += 1
                continue
            if (
                retry
                and resp.status_code >= 400
                and self.retry.should_retry(method, resp.status_code, attempt)
            ):
                time.sleep(self.retry.delay_s(attempt, resp.headers.get("retry-after")))
                attempt += 1
                continue
            return _base.unwrap(resp)

    def open_stream(self, method: str, path: str, **kwargs: Any) -> Any:
        """A streamed response (never retried); an error status raises the typed error at once."""
        try:
            resp = self._http.send(self._http.build_request(method, path, **kwargs), stream=True)
        except httpx.TransportError as exc:
            raise TransportError(str(exc) or type(exc).__name__) from exc
        if resp.status_code >= 400:
            try:
                _base.raise_for_error(resp, resp.read())
            finally:
                resp.close()
        return resp

    def paginate(
        self, path: str, params: dict[str, Any] | None = None, *, page_size: int = 500
    ) -> Iterator[Any]:
        """Every item of a paginated list: ``offset`` advances by the items received until ``total``."""
        offset = 0
        while True:
            page = self.request("GET", path, params={**(params or {}), "limit": page_size, "offset": offset})
            items, total = _base.page_items(page)
            yield from items
            offset += len(items)
            if not items or total is None or offset >= total:
                return

    def whoami(self) -> dict[str, Any]:
        return dict(self.request("GET", "v1/whoami"))

    def shapes(self) -> list[dict[str, Any]]:
        return list(self.paginate("v1/shapes"))

    def rootfs(self) -> dict[str, Any]:
        return dict(self.request("GET", "v1/rootfs"))

    def hosts(self) -> list[dict[str, Any]]:
        return list(self.paginate("v1/hosts"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Client", "Sandbox", "Sandboxes"]

"""``HostAgentClient``: the one way the control plane talks to a host agent (internal HTTP API).

Imports nothing but aiohttp and httpx, so the control plane can use it without the host agent's other
dependencies. Request/response calls (exec included: the hot path) go over aiohttp, which costs about
half of httpx's CPU per request here; streams, uploads and downloads use httpx.

    HostAgentError                .status, .code (the agent's ``error`` field)
    ├── HostUnavailableError      no answer (connection refused, timeout, dropped stream)
    ├── SandboxMissingError       404 unknown sandbox
    ├── GuestFileNotFoundError    404 file_not_found
    ├── ParentNotFoundError       404 parent_not_found
    ├── IsDirectoryError          400 is_directory
    ├── BadPathError              400 bad_path
    ├── UnknownImageError         400 unknown_image (not in the catalog, or not buildable on that host)
    ├── BadStateError             409 (the sandbox is not in a state for this; or the id already exists)
    └── InsufficientCapacityError 507 (no memory, addresses or disk left on that host)

Any other answer (400 bad_request, 401, 500 sandbox_failed …) is a plain ``HostAgentError`` with its
``status`` and ``code``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import httpx


class HostAgentError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class HostUnavailableError(HostAgentError):
    pass


class SandboxMissingError(HostAgentError):
    pass


class GuestFileNotFoundError(HostAgentError):
    pass


class ParentNotFoundError(HostAgentError):
    pass


class IsDirectoryError(HostAgentError):
    pass


class BadStateError(HostAgentError):
    pass


class BadPathError(HostAgentError):
    pass


class UnknownImageError(HostAgentError):
    pass


class InsufficientCapacityError(HostAgentError):
    pass


_BY_CODE: dict[str, type[HostAgentError]] = {
    "file_not_found": GuestFileNotFoundError,
    "parent_not_found": ParentNotFoundError,
    "is_directory": IsDirectoryError,
    "sandbox_not_found": SandboxMissingError,
    "bad_path": BadPathError,
    "unknown_image": UnknownImageError,
}
# Creating or forking may first build the image (minutes for devbox:1); the agent answers when booted.
_CREATE_TIMEOUT = httpx.Timeout(900.0, connect=5.0)


def _error_for(resp: httpx.Response, body: bytes) -> HostAgentError:
    return _error_from(resp.status_code, body)


def _error_from(status: int, body: bytes) -> HostAgentError:
    code, message = None, f"host agent answered {status}"
    try:
        doc = json.loads(body)
        code = doc.get("error")
        message = str(doc.get("message") or message)
    except (ValueError, AttributeError):
        pass
    # 507 is capacity whatever the body says: callers place elsewhere or answer 503 on it, so it must
    # not depend on the agent's wording or code.
    cls = InsufficientCapacityError if status == 507 else _BY_CODE.get(code or "")
    if cls is None:
        cls = {404: SandboxMissingError, 409: BadStateError, 507: InsufficientCapacityError}.get(
            status, HostAgentError
        )
    return cls(message, status=status, code=code)


def _aiohttp_timeout(timeout: httpx.Timeout | float | None, default: httpx.Timeout) -> aiohttp.ClientTimeout:
    if not isinstance(timeout, httpx.Timeout):
        timeout = default if timeout is None else httpx.Timeout(timeout, connect=5.0)
    return aiohttp.ClientTimeout(total=None, connect=timeout.connect, sock_read=timeout.read)


def _loads(body: bytes) -> Any:
    return json.loads(body)


class HostAgentClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 60.0) -> None:
        self._base = base_url.rstrip("/") + "/internal/v1/"
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = httpx.Timeout(timeout_s, connect=5.0)
        self._http = httpx.AsyncClient(
            base_url=self._base,
            headers=self._headers,
            timeout=self._timeout,
            limits=httpx.Limits(max_keepalive_connections=64, max_connections=256),
        )
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the event loop

    def _aiohttp(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=256, limit_per_host=256, keepalive_timeout=30),
                json_serialize=lambda doc: json.dumps(doc, separators=(",", ":")),
            )
        return self._session

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> HostAgentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _json(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout: httpx.Timeout | float | None = None,
        content: AsyncIterator[bytes] | bytes | None = None,
    ) -> Any:
        if content is not None:  # streamed request bodies go through httpx
            try:
                resp = await self._http.request(method, path, params=params, content=content)
            except httpx.TransportError as exc:
                raise HostUnavailableError(str(exc) or type(exc).__name__) from exc
            if resp.status_code >= 400:
                raise _error_for(resp, resp.content)
            return resp.json()
        try:
            async with self._aiohttp().request(
                method,
                self._base + path,
                json=json,
                params=params,
                timeout=_aiohttp_timeout(timeout, self._timeout),
            ) as resp:
                body = await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise HostUnavailableError(str(exc) or type(exc).__name__) from exc
        if resp.status >= 400:
            raise _error_from(resp.status, body)
        return _loads(body)

    @staticmethod
    def _sb(sandbox_id: str, *rest: str) -> str:
        return "/".join(["sandboxes", quote(sandbox_id, safe=""), *rest])

    async def info(self) -> dict[str, Any]:
        return dict(await self._json("GET", "info"))

    async def create_sandbox(self, **spec: Any) -> dict[str, Any]:
        """``spec``: id, name, rootfs, vcpu, mem_mib, cpu_quota_pct, disk_mib, start_paused, egress
        (normalised rules; empty: open), bandwidth_quota_bytes (-1: unmetered).

        Returns ``{id, ip, spawn_ms, status}`` once the sandbox's guest agent answers."""
        return dict(await self._json("POST", "sandboxes", json=spec, timeout=_CREATE_TIMEOUT))

    async def list_sandboxes(self) -> list[dict[str, Any]]:
        return list(await self._json("GET", "sandboxes"))

    async def get_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        return dict(await self._json("GET", self._sb(sandbox_id)))

    async def pause_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        return dict(await self._json("POST", self._sb(sandbox_id, "pause")))

    async def resume_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        return dict(await self._json("POST", self._sb(sandbox_id, "resume")))

    async def fork_sandbox(
        self,
        sandbox_id: str,
        *,
        new_id: str,
        name: str,
        start_paused: bool,
        egress: list[str] | None = None,
        bandwidth_quota_bytes: int = -1,
    ) -> dict[str, Any]:
        body = {
            "new_id": new_id,
            "name": name,
            "start_paused": start_paused,
            "egress": list(egress or []),
            "bandwidth_quota_bytes": bandwidth_quota_bytes,
        }
        return dict(
            await self._json("POST", self._sb(sandbox_id, "fork"), json=body, timeout=_CREATE_TIMEOUT)
        )

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> dict[str, Any]:
        """Replaces the allowlist of a running or paused sandbox; returns ``{id, egress}``."""
        return dict(await self._json("PUT", self._sb(sandbox_id, "egress"), json={"egress": rules}))

    async def get_bandwidth(self, sandbox_id: str) -> dict[str, Any]:
        """``{id, quota_bytes, egress_bytes, ingress_bytes, capped}`` counted in the kernel right now."""
        return dict(await self._json("GET", self._sb(sandbox_id, "bandwidth")))

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> dict[str, Any]:
        """A new total egress budget (-1: unmetered); returns the counters like ``get_bandwidth``."""
        body = {"quota_bytes": quota_bytes}
        return dict(await self._json("PUT", self._sb(sandbox_id, "bandwidth"), json=body))

    async def resize_sandbox(self, sandbox_id: str, disk_mib: int) -> dict[str, Any]:
        return dict(await self._json("POST", self._sb(sandbox_id, "resize"), json={"disk_mib": disk_mib}))

    async def destroy_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        return dict(await self._json("DELETE", self._sb(sandbox_id)))

    async def attach_network(
        self, sandbox_id: str, *, network_id: str, ip: str, prefixlen: int
    ) -> dict[str, Any]:
        """Puts the sandbox on the network's bridge with ``ip/prefixlen``; idempotent.

        Returns ``{network_id, ip, prefixlen, ifname}`` (``ifname`` is the interface inside the sandbox)."""
        body = {"network_id": network_id, "ip": ip, "prefixlen": prefixlen}
        return dict(await self._json("POST", self._sb(sandbox_id, "networks"), json=body))

    async def detach_network(self, sandbox_id: str, network_id: str) -> dict[str, Any]:
        """Removes the sandbox's interface on that network; idempotent."""
        return dict(await self._json("DELETE", self._sb(sandbox_id, "networks", quote(network_id, safe=""))))

    async def exec(
        self,
        sandbox_id: str,
        *,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None = None,
        cwd: str | None = None,
    ) -> dict[str, Any]:
        body = {"cmd": cmd, "args": args, "env": env, "stdin": stdin, "cwd": cwd, "stream": False}
        # A command may run for as long as it likes; only connecting is bounded.
        timeout = httpx.Timeout(None, connect=5.0)
        return dict(await self._json("POST", self._sb(sandbox_id, "exec"), json=body, timeout=timeout))

    async def exec_stream(
        self,
        sandbox_id: str,
        *,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None = None,
        cwd: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Frames as the command produces them; leaving the iteration early kills the command."""
        body = {"cmd": cmd, "args": args, "env": env, "stdin": stdin, "cwd": cwd, "stream": True}
        try:
            async with self._http.stream(
                "POST", self._sb(sandbox_id, "exec"), json=body, timeout=httpx.Timeout(None, connect=5.0)
            ) as resp:
                if resp.status_code >= 400:
                    raise _error_for(resp, await resp.aread())
                async for line in resp.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as exc:
            raise HostUnavailableError(str(exc) or type(exc).__name__) from exc

    async def upload(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
        return dict(
            await self._json("PUT", self._sb(sandbox_id, "files"), params={"path": path}, content=chunks)
        )

    async def download(self, sandbox_id: str, path: str) -> tuple[int | None, AsyncIterator[bytes]]:
        """Open a download: returns (size, chunks). Errors are raised before any byte is returned."""
        request = self._http.build_request("GET", self._sb(sandbox_id, "files"), params={"path": path})
        try:
            resp = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise HostUnavailableError(str(exc) or type(exc).__name__) from exc
        if resp.status_code >= 400:
            body = await resp.aread()
            await resp.aclose()
            raise _error_for(resp, body)
        length = resp.headers.get("content-length")

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_bytes():
                    yield chunk
            finally:
                await resp.aclose()

        return (int(length) if length and length.isdigit() else None), chunks()

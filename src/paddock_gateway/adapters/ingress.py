"""``IngressProbe``: is a deployed app reachable at its public ingress URL, seen from the gateway?

Any HTTP answer from the app counts (a 404 from the app is still the app). The ingress proxy's own
answers carry ``X-Paddock-Ingress-Error`` (unknown sandbox, ingress off, nothing listening …) and do not
count. Names under ``.localhost`` are dialled at 127.0.0.1 with the name in ``Host`` (RFC 6761: they are
loopback; curl does the same, Python's resolver does not), so a local ``paddock serve`` works as is.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

INGRESS_ERROR_HEADER = "x-paddock-ingress-error"


def _target(url: str) -> tuple[str, dict[str, str], bool]:
    """The URL to dial, its headers, and whether it is a loopback ``.localhost`` name over HTTPS (then
    the name goes in SNI, and the certificate, from ``paddock serve``'s local CA, is not checked: the
    connection never leaves this machine)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme in ("http", "https") and (host == "localhost" or host.endswith(".localhost")):
        netloc = "127.0.0.1" + (f":{parts.port}" if parts.port else "")
        return parts._replace(netloc=netloc).geturl(), {"Host": parts.netloc}, parts.scheme == "https"
    return url, {}, False


class IngressProbe:
    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s

    async def check(self, url: str) -> str | None:
        """``None`` when the app answered through ``url``; otherwise why not."""
        target, headers, loopback_tls = _target(url.rstrip("/") + "/")
        sni = {"sni_hostname": urlsplit(url).hostname or ""} if loopback_tls else None
        try:
            async with httpx.AsyncClient(
                timeout=self.timeout_s, follow_redirects=False, verify=not loopback_tls
            ) as http:
                response = await http.get(target, headers=headers, extensions=sni)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        proxy_error = response.headers.get(INGRESS_ERROR_HEADER)
        if proxy_error:
            return f"the ingress proxy answered {response.status_code} ({proxy_error})"
        return None

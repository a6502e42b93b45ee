"""One TLS client context per process for the services' HTTP clients.

httpx builds a fresh ``ssl.SSLContext`` for every client it makes, loading the whole CA bundle each
time: 40 ms of CPU on the 2-core dev box, whether or not the client ever speaks TLS (a host agent's
``http://`` address). The control plane makes one client per host it links to, on that host's first
call (a create, usually), so each host's first create paid it. An ``SSLContext`` can be shared by
any number of clients and connections.

The context is what httpx would build (``httpx.create_ssl_context()``: certifi's bundle, or the file or
directory ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name), made again when those variables change.
"""

from __future__ import annotations

import functools
import os
import ssl

import httpx


def client_context() -> ssl.SSLContext:
    """The process's TLS context for outbound HTTPS, verifying as httpx does by default."""
    return _context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    # The arguments are the cache's key: httpx reads the same variables itself.
    return httpx.create_ssl_context()

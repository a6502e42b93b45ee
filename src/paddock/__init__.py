"""Paddock's Python SDK: ``Client`` and ``AsyncClient`` for the sandbox control plane."""

from __future__ import annotations

from paddock._async_client import AsyncClient, AsyncSandbox, AsyncSandboxes
from paddock._base import RetryPolicy
from paddock._client import Client, Sandbox, Sandboxes
from paddock._errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    NotFoundError,
    PaddockError,
    PayloadTooLargeError,
    PaymentRequiredError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitedError,
    ServerError,
    TransportError,
    ValidationError,
    WaitTimeoutError,
)
from paddock._models import ExecResult, SandboxInfo

__version__ = "0.1.0"
__all__ = [
    "APIError",
    "AsyncClient",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AuthenticationError",
    "Client",
    "ConflictError",
    "ExecResult",
    "NotFoundError",
    "PaddockError",
    "PayloadTooLargeError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "ProtocolError",
    "RateLimitedError",
    "RetryPolicy",
    "Sandbox",
    "SandboxInfo",
    "Sandboxes",
    "ServerError",
    "TransportError",
    "ValidationError",
    "WaitTimeoutError",
]

"""Paddock's Python SDK: ``AsyncClient`` (and ``Client``) for the sandbox control plane."""

from __future__ import annotations

from paddock._async_client import AsyncClient, AsyncSandbox, AsyncSandboxes
from paddock._base import RetryPolicy
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
    "SandboxInfo",
    "ServerError",
    "TransportError",
    "ValidationError",
    "WaitTimeoutError",
]

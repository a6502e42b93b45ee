"""Paddock's Python SDK: ``Client`` / ``AsyncClient`` for the sandbox control plane, ``GatewayClient``
for the pay-per-deploy gateway (``pip install paddock[wallet]``), ``paddock.webhooks`` for receivers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paddock import webhooks
from paddock._async_client import AsyncClient
from paddock._async_computer import AsyncComputer
from paddock._async_processes import AsyncCommandHandle, AsyncProcesses
from paddock._async_sandbox import AsyncFiles, AsyncSandbox, AsyncSandboxes
from paddock._base import RetryPolicy
from paddock._client import Client
from paddock._code import CodeInterpreterError, Execution, ExecutionError, Result
from paddock._computer import Computer
from paddock._errors import (
    APIError,
    AuthenticationError,
    CommandStartError,
    CommandTimeoutError,
    ConflictError,
    DeploymentFailedError,
    InsufficientFundsError,
    NotFoundError,
    PaddockError,
    PaddockWarning,
    PayloadTooLargeError,
    PaymentError,
    PaymentRequiredError,
    PaymentVerificationError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitedError,
    SandboxStateError,
    ServerError,
    TransportError,
    ValidationError,
    WaitTimeoutError,
    WebhookVerificationError,
)
from paddock._models import (
    AccessToken,
    AccountMetrics,
    AuditEvent,
    Bandwidth,
    BuildLogFrame,
    Chain,
    Credits,
    DeploymentStatus,
    Disk,
    ExecResult,
    FileEntry,
    FileEvent,
    HostInfo,
    LiveView,
    ManagedProcess,
    MetricSample,
    Network,
    NetworkMember,
    Project,
    ProjectDeleted,
    Recipient,
    Recipients,
    RootfsData,
    RootfsEntry,
    SandboxDisk,
    SandboxInfo,
    SandboxLogs,
    SandboxMetrics,
    Screen,
    Shape,
    Snapshot,
    Template,
    TokenBalance,
    WalletBalance,
    WebhookDelivery,
    WebhookEndpoint,
    WhoAmI,
    WhoAmIStats,
    Window,
    WindowGeometry,
)
from paddock._processes import CommandHandle, Processes
from paddock._sandbox import Files, Sandbox, Sandboxes

if TYPE_CHECKING:
    from paddock.gateway import Deployment, GatewayClient
    from paddock.wallet_sandbox import WalletSandbox
    from paddock.x402 import OfferNotFoundError


def __getattr__(name: str) -> Any:
    """``GatewayClient`` needs the ``wallet`` extra (eth-account, web3): imported on first use only, as
    are the gateway's payment types."""
    if name in ("GatewayClient", "Deployment"):
        from paddock import gateway

        return getattr(gateway, name)
    if name == "WalletSandbox":
        from paddock.wallet_sandbox import WalletSandbox

        return WalletSandbox
    if name == "OfferNotFoundError":
        from paddock.x402 import OfferNotFoundError

        return OfferNotFoundError
    raise AttributeError(f"module 'paddock' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
    "APIError",
    "AccessToken",
    "AccountMetrics",
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncComputer",
    "AsyncFiles",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AuditEvent",
    "AuthenticationError",
    "Bandwidth",
    "BuildLogFrame",
    "Chain",
    "Client",
    "CodeInterpreterError",
    "CommandHandle",
    "CommandStartError",
    "CommandTimeoutError",
    "Computer",
    "ConflictError",
    "Credits",
    "Deployment",
    "DeploymentFailedError",
    "DeploymentStatus",
    "Disk",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "FileEntry",
    "FileEvent",
    "Files",
    "GatewayClient",
    "HostInfo",
    "InsufficientFundsError",
    "LiveView",
    "ManagedProcess",
    "MetricSample",
    "Network",
    "NetworkMember",
    "NotFoundError",
    "OfferNotFoundError",
    "PaddockError",
    "PaddockWarning",
    "PayloadTooLargeError",
    "PaymentError",
    "PaymentRequiredError",
    "PaymentVerificationError",
    "PermissionDeniedError",
    "Processes",
    "Project",
    "ProjectDeleted",
    "ProtocolError",
    "RateLimitedError",
    "Recipient",
    "Recipients",
    "Result",
    "RetryPolicy",
    "RootfsData",
    "RootfsEntry",
    "Sandbox",
    "SandboxDisk",
    "SandboxInfo",
    "SandboxLogs",
    "SandboxMetrics",
    "SandboxStateError",
    "Sandboxes",
    "Screen",
    "ServerError",
    "Shape",
    "Snapshot",
    "Template",
    "TokenBalance",
    "TransportError",
    "ValidationError",
    "WaitTimeoutError",
    "WalletBalance",
    "WalletSandbox",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookVerificationError",
    "WhoAmI",
    "WhoAmIStats",
    "Window",
    "WindowGeometry",
    "webhooks",
]

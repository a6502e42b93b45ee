"""Typed views of the API's payloads. Unknown fields are kept in ``extra``, never rejected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SandboxInfo:
    id: str
    status: str
    name: str | None = None
    ip: str | None = None
    shape: str | None = None
    rootfs: str | None = None
    vcpu: int | None = None
    mem_mib: int | None = None
    disk_mib: int | None = None
    ingress_url_template: str | None = None
    forked_from: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SandboxInfo:
        known = {k: data.get(k) for k in cls.__dataclass_fields__ if k != "extra" and k in data}
        return cls(**known, extra={k: v for k, v in data.items() if k not in cls.__dataclass_fields__})

    def ingress_url(self, port: int) -> str:
        if not self.ingress_url_template:
            raise ValueError("ingress is not enabled on this sandbox")
        return self.ingress_url_template.replace("<port>", str(port))


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    exec_ms: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ExecResult:
        result = data.get("result", {})
        return cls(
            stdout=result.get("stdout", ""),
            stderr=result.get("stderr", ""),
            exit_code=int(result.get("exit_code", -1)),
            exec_ms=float(data.get("exec_ms", 0.0)),
            error=result.get("error"),
        )

"""A stand-in host agent over real HTTP on 127.0.0.1: the control plane registers it by heartbeat and
talks to it through the real ``HostAgentClient``; each call answers 200, or the agent's 507 on demand.
Answers are built from the contract's models (``paddock_hostagent.schemas``), which the client parses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from paddock_hostagent.schemas import CreateSandboxResult, DestroyResult, ExecResult, FileWritten

FULL = {"error": "insufficient_capacity", "message": "256 MiB requested, 41 MiB free"}


@dataclass
class FakeAgent:
    """The host agent's internal API as far as create, fork, pause, resume, destroy, a file upload and
    a buffered exec (always exit 0) go."""

    id: str
    total_mib: int = 4096
    free_mib: int = 4096
    refuse: set[str] = field(default_factory=set)  # "create", "fork", "resume": answer 507
    calls: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def app(self) -> Starlette:
        async def create(request: Request) -> JSONResponse:
            body = await request.json()
            return self._answer("create", str(body["id"]))

        async def fork(request: Request) -> JSONResponse:
            body = await request.json()
            return self._answer("fork", str(body["new_id"]))

        async def action(request: Request) -> JSONResponse:
            name = request.url.path.rsplit("/", 1)[1]
            return self._answer(name, request.path_params["sid"])

        async def destroy(request: Request) -> JSONResponse:
            self.calls.append(("destroy", request.path_params["sid"]))
            return JSONResponse(DestroyResult().model_dump())

        async def upload(request: Request) -> JSONResponse:
            self.calls.append(("upload", request.path_params["sid"]))
            written = FileWritten(path=request.query_params["path"], size=len(await request.body()))
            return JSONResponse(written.model_dump())

        async def run(request: Request) -> JSONResponse:
            self.calls.append(("exec", request.path_params["sid"]))
            return JSONResponse(
                ExecResult(stdout="", stderr="", exit_code=0, exec_ms=0.1).model_dump(exclude_none=True)
            )

        return Starlette(
            routes=[
                Route("/internal/v1/sandboxes", create, methods=["POST"]),
                Route("/internal/v1/sandboxes/{sid}/fork", fork, methods=["POST"]),
                Route("/internal/v1/sandboxes/{sid}/pause", action, methods=["POST"]),
                Route("/internal/v1/sandboxes/{sid}/resume", action, methods=["POST"]),
                Route("/internal/v1/sandboxes/{sid}", destroy, methods=["DELETE"]),
                Route("/internal/v1/sandboxes/{sid}/files", upload, methods=["PUT"]),
                Route("/internal/v1/sandboxes/{sid}/exec", run, methods=["POST"]),
            ]
        )

    def _answer(self, call: str, sandbox_id: str) -> JSONResponse:
        self.calls.append((call, sandbox_id))
        if call in self.refuse:
            return JSONResponse(FULL, status_code=507)
        booted = CreateSandboxResult(id=sandbox_id, ip="10.88.0.2", spawn_ms=1.0, status="running")
        return JSONResponse(booted.model_dump())

    def created(self) -> list[str]:
        return [sid for call, sid in self.calls if call == "create"]

    def beat(self, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "free_mib": self.free_mib,
            "total_mib": self.total_mib,
            "rootfses": ["debian:13", "devbox:1"],
            "labels": labels or {"zone": "a"},
        }

"""E2B's code interpreter (port 49999: ``POST /execute`` as NDJSON, ``/contexts`` CRUD and restart,
``/health``) on Paddock's interpreter: the same in-sandbox driver ``sandbox.run_code`` ships (the
``paddock`` package's ``_code_client.py``/``_code_server.py``, one IPython kernel per context,
docs/code-interpreter.md), run through the sandbox's exec with the cell on stdin. The driver's lines
become E2B's: ``stdout``/``stderr`` (with a timestamp), ``result`` (MIME types as E2B's fields: text,
html, png …), ``error`` (name, value, traceback as text) and ``number_of_executions``.

Contexts are names of kernels: ``default`` and those created here (kept per sandbox in this process,
bounded). A restart kills the context's kernel (its next cell starts a fresh one); a context's ``cwd`` is
set by a first cell. The client's own timeout ends the request; the cell is given ``MAX_CELL_S``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import posixpath
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from paddock_controlplane.edge.e2b import identity
from paddock_controlplane.edge.e2b.edge.context import audited_as
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import validation
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import commands
from paddock_controlplane.sandboxes.activity import Inflight, touch
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b.edge")


def _driver_dir() -> Path:
    spec = importlib.util.find_spec("paddock")
    assert spec is not None and spec.origin is not None, "the paddock package ships the driver"
    return Path(spec.origin).parent


CLIENT_SOURCE = (_driver_dir() / "_code_client.py").read_bytes()
SERVER_SOURCE = (_driver_dir() / "_code_server.py").read_bytes()
# Named as the SDK names them, so the SDK's run_code and E2B's share one server and its kernels.
_HASH = hashlib.sha256(CLIENT_SOURCE + b"\0" + SERVER_SOURCE).hexdigest()[:12]
CLIENT_PATH = f"/tmp/.paddock-code-{_HASH}.py"
SERVER_PATH = f"/tmp/.paddock-code-{_HASH}-server.py"
INSTALL_SCRIPT = 'mv -f "$1" "$2" && mv -f "$3" "$4"'
#: Kills the context's kernel and waits (up to 5 s) until it is dead, a zombie or gone: ``kill`` returns
#: before the process has exited, and the restart's next cell (its ``cwd``) then ran on the dying kernel
#: and waited out the E2B SDK's request timeout (a full run's ``restart_code_context`` did).
RESTART_SCRIPT = """pid=$(cat "$1" 2>/dev/null) && kill -9 "$pid" 2>/dev/null || exit 0
i=0
while [ $i -lt 500 ] && [ -r "/proc/$pid/status" ] && ! grep -qs '^State:[[:space:]]*Z' "/proc/$pid/status"; do
  sleep 0.01; i=$((i + 1))
done
exit 0"""
STATE_DIR = "/tmp/.paddock-kernels"
MAX_CELL_S = 3600.0
CONTEXT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_CONTEXTS = 100
MAX_BODY_BYTES = commands.MAX_EXEC_BODY_BYTES
#: Jupyter's MIME types and E2B's ``Result`` fields.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}

#: sandbox id -> context id -> {"id", "language", "cwd"}; ``default`` is implicit.
_contexts: OrderedDict[str, dict[str, dict[str, str]]] = OrderedDict()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _default(sandbox_id: str) -> dict[str, str]:
    return {"id": "default", "language": "python", "cwd": "/root"}


def _known(sandbox_id: str) -> dict[str, dict[str, str]]:
    known = _contexts.setdefault(sandbox_id, {})
    _contexts.move_to_end(sandbox_id)
    while len(_contexts) > 10_000:
        _contexts.popitem(last=False)
    return known


async def handle(services: Services, sandbox: Sandbox, request: Request) -> Response:
    path, method = request.url.path, request.method
    if path == "/health":
        return Response(status_code=204)
    if not identity.carries_token(services.settings, sandbox.id, request.headers):
        return _error(401, "X-Access-Token: missing or not this sandbox's")
    audited_as(request, sandbox, "envd")
    link = await hostlink.for_host(services, sandbox.host_id)
    touch(services, sandbox.id)
    try:
        if path == "/execute" and method == "POST":
            return await execute(services, sandbox, link, request)
        if path == "/contexts" and method == "POST":
            return await create_context(services, sandbox, link, await _json(request))
        if path == "/contexts" and method == "GET":
            known = _known(sandbox.id)
            return JSONResponse([_default(sandbox.id), *known.values()])
        parts = path.strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "contexts":
            known = _known(sandbox.id)
            context_id = parts[1]
            if context_id != "default" and context_id not in known:
                return _error(404, f"context {context_id} not found")
            if len(parts) == 2 and method == "DELETE":
                await _restart(services, sandbox, link, context_id)
                known.pop(context_id, None)
                return Response(status_code=204)
            if len(parts) == 3 and parts[2] == "restart" and method == "POST":
                await _restart(services, sandbox, link, context_id)
                cwd = known.get(context_id, {}).get("cwd")
                if cwd:
                    await _chdir(services, sandbox, link, context_id, cwd)
                return Response(status_code=204)
    except (hostlink.HostError, hostlink.SandboxGoneError) as exc:
        return _error(502, f"the sandbox {sandbox.id} was not found: {exc}")
    except _BadRequest as exc:
        return _error(400, str(exc))
    return _error(404, f"{method} {path} is not served by the code interpreter")


class _BadRequest(Exception):
    pass


async def _json(request: Request) -> dict[str, Any]:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _BadRequest(f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        raise _BadRequest("the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise _BadRequest("the body must be a JSON object")
    return value


def _language(value: Any) -> str:
    if value in (None, "", "python", "python3"):
        return "python"
    raise _BadRequest(f"language: {value!r} is not served; Paddock's interpreter runs python")


async def _install(link: hostlink.HostLinkAPI, sandbox_id: str) -> None:
    """Ships the driver, written beside its place and renamed, so a concurrent call never runs half."""
    suffix = secrets.token_hex(4)
    partial_server, partial_client = f"{SERVER_PATH}.{suffix}", f"{CLIENT_PATH}.{suffix}"

    async def once(data: bytes) -> AsyncIterator[bytes]:
        yield data

    await link.upload(sandbox_id, partial_server, once(SERVER_SOURCE))
    await link.upload(sandbox_id, partial_client, once(CLIENT_SOURCE))
    args = ["-c", INSTALL_SCRIPT, "sh", partial_server, SERVER_PATH, partial_client, CLIENT_PATH]
    await link.exec(sandbox_id, "sh", args, {}, None)


async def _cell(
    services: Services,
    sandbox: Sandbox,
    link: hostlink.HostLinkAPI,
    context: str,
    code: str,
    envs: dict[str, str] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The driver's messages for one cell (installing the driver first if the sandbox lacks it); ``envs``
    are the cell's own environment variables (E2B's ``env_vars``), put back once it ends."""
    args = ["-S", CLIENT_PATH, context, str(MAX_CELL_S)]
    if envs:  # a JSON line before the cell, as the driver's ``--envs`` reads it: env values are secrets,
        # and a command's arguments are in the audit trail, its stdin is not
        args.append("--envs")
        code = json.dumps(envs) + "\n" + code
    for attempt in range(2):
        pending, lines, stderr, missing = "", 0, "", False
        exit_code: int | None = None
        async for frame in link.exec_stream(sandbox.id, "python3", args, {}, code):
            if frame.get("stdout"):
                pending += frame["stdout"]
                *complete, pending = pending.split("\n")
                for line in complete:
                    if line.strip():
                        lines += 1
                        try:
                            yield json.loads(line)
                        except ValueError:
                            yield {"type": "stderr", "text": line + "\n"}
            if frame.get("stderr"):
                stderr = (stderr + frame["stderr"])[-4000:]
            if frame.get("error"):
                yield {"type": "driver_error", "message": str(frame["error"])}
                return
            if "exit_code" in frame:
                exit_code = int(frame["exit_code"])
        missing = lines == 0 and exit_code == 2 and "can't open file" in stderr
        if not missing or attempt:
            if pending.strip():
                yield json.loads(pending) if pending.startswith("{") else {"type": "stderr", "text": pending}
            if lines == 0:
                yield {
                    "type": "driver_error",
                    "message": (stderr.strip() or f"exit code {exit_code}")[-2000:],
                }
            return
        await _install(link, sandbox.id)


def _stamp() -> int:
    return time.time_ns() // 1000


def _e2b(message: dict[str, Any]) -> dict[str, Any] | None:
    kind = message.get("type")
    if kind in ("stdout", "stderr"):
        return {"type": kind, "text": str(message.get("text", "")), "timestamp": _stamp()}
    if kind == "result":
        data = message.get("data") or {}
        out: dict[str, Any] = {"type": "result", "is_main_result": bool(message.get("is_main_result"))}
        extra = {}
        for mime, value in data.items():
            if mime in MIME_FIELDS:
                out[MIME_FIELDS[mime]] = value
            else:
                extra[mime] = value
        if extra:
            out["extra"] = extra
        return out
    if kind == "error":
        traceback = message.get("traceback") or []
        return {
            "type": "error",
            "name": str(message.get("name", "")),
            "value": str(message.get("value", "")),
            "traceback": "\n".join(traceback) if isinstance(traceback, list) else str(traceback),
        }
    if kind == "end":
        return {"type": "number_of_executions", "execution_count": message.get("execution_count") or 0}
    if kind == "driver_error":
        return {
            "type": "error",
            "name": "CodeInterpreterError",
            "value": f"{message.get('message', '')} (the code interpreter needs python3 with ipykernel: "
            "create the sandbox from code-interpreter-v1)",
            "traceback": "",
        }
    return None


async def execute(
    services: Services, sandbox: Sandbox, link: hostlink.HostLinkAPI, request: Request
) -> Response:
    body = await _json(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise _BadRequest("code: is required (a string)")
    if len(code.encode("utf-8", "surrogatepass")) > commands.MAX_EXEC_STDIN_BYTES:
        return _error(413, f"code: is over {commands.MAX_EXEC_STDIN_BYTES} bytes")
    context = body.get("context_id") or "default"
    if not isinstance(context, str) or not CONTEXT_RE.match(context):
        raise _BadRequest("context_id: must be 1-64 of A-Z a-z 0-9 _ . -")
    if context != "default" and context not in _known(sandbox.id):
        return _error(404, f"context {context} not found")
    if body.get("context_id") and body.get("language"):
        raise _BadRequest("context_id and language: give one, not both")
    _language(body.get("language"))
    env_vars = body.get("env_vars")
    # A JSON object's keys are strings already; its values need not be.
    if env_vars is not None and not (
        isinstance(env_vars, dict) and all(isinstance(v, str) for v in env_vars.values())
    ):
        raise _BadRequest("env_vars: must be an object of strings")
    try:  # the bounds and names of a sandbox's own envs (isolation rule 5)
        envs = validation.envs(env_vars, "env_vars")
    except errors.ValidationFailed as exc:
        raise _BadRequest(str(exc)) from None
    if any("\0" in value for value in envs.values()):
        raise _BadRequest("env_vars: a value holds NUL")

    async def lines() -> AsyncIterator[bytes]:
        with Inflight(services, sandbox.id):
            try:
                async for message in _cell(services, sandbox, link, context, code, envs):
                    out = _e2b(message)
                    if out is not None:
                        yield json.dumps(out, ensure_ascii=False).encode() + b"\n"
            except (hostlink.HostError, hostlink.SandboxGoneError) as exc:
                error = {"type": "error", "name": "SandboxError", "value": str(exc), "traceback": ""}
                yield json.dumps(error).encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _run_quiet(
    services: Services, sandbox: Sandbox, link: hostlink.HostLinkAPI, context: str, code: str
) -> None:
    async for message in _cell(services, sandbox, link, context, code):
        if message.get("type") == "driver_error":
            raise _BadRequest(f"the context's kernel did not start: {message.get('message')}")


async def _chdir(
    services: Services, sandbox: Sandbox, link: hostlink.HostLinkAPI, context: str, cwd: str
) -> None:
    await _run_quiet(services, sandbox, link, context, f"import os as _os\n_os.chdir({cwd!r})\ndel _os")


async def create_context(
    services: Services, sandbox: Sandbox, link: hostlink.HostLinkAPI, body: dict[str, Any]
) -> Response:
    language = _language(body.get("language"))
    cwd = body.get("cwd") or "/root"
    if not isinstance(cwd, str) or not cwd.startswith("/") or len(cwd) > 4096 or "\0" in cwd:
        raise _BadRequest("cwd: must be an absolute path")
    known = _known(sandbox.id)
    if len(known) >= MAX_CONTEXTS:
        return _error(429, f"a sandbox keeps at most {MAX_CONTEXTS} contexts; delete one")
    context_id = secrets.token_hex(8)
    await _chdir(services, sandbox, link, context_id, posixpath.normpath(cwd))
    known[context_id] = {"id": context_id, "language": language, "cwd": cwd}
    return JSONResponse(known[context_id])


async def _restart(services: Services, sandbox: Sandbox, link: hostlink.HostLinkAPI, context: str) -> None:
    await link.exec(sandbox.id, "sh", ["-c", RESTART_SCRIPT, "sh", f"{STATE_DIR}/{context}.pid"], {}, None)


__all__ = ["handle", "log"]

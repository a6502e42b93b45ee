"""Computer use on a desktop sandbox (spec §12.3): screenshots, mouse, keyboard, windows, screens.

Every operation is one command in the sandbox through the ordinary exec path (control plane → host agent
→ guest agent). The helper (``paddock_core/guest/desktop_helper.py``, sent by this control plane, so it
always matches it) starts the screen's X session on first use and answers one JSON document; a
screenshot's PNG comes back base64, since exec output is text. The first call runs it as
``python3 -c <helper> <operation> <JSON arguments> <socket>``, after which it stays resident on that
unix socket; later calls are ``curl --unix-socket <socket>`` with the arguments on stdin, which spares
each call a Python start and Pillow's import (most of a screenshot's time before). The socket's name
carries the helper's digest, so a control plane never reaches a helper of another version; whenever curl
cannot connect (a fork, a hibernated or restarted sandbox, an idle helper that exited, an image without
curl) the call falls back to the ``python3 -c`` form, which starts the helper again; so does a read whose
reply was lost (``run_helper``). Bodies are validated here first (400 naming the field), and again by
the helper. Only sandboxes booted from ``desktop:1`` — or from a template built ``FROM desktop:1`` —
take these calls; any other gets 409 ``INVALID_STATE``. A call counts as activity for idle auto-pause.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import re
from importlib import resources
from typing import Any, Protocol

from pydantic import BaseModel
from sqlalchemy import select

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox, Template
from paddock_controlplane.records.queries import running_sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import desktop_access
from paddock_controlplane.sandboxes.activity import Inflight
from paddock_core import errors
from paddock_core.timeutil import rfc3339

HELPER_SOURCE = resources.files("paddock_core.guest").joinpath("desktop_helper.py").read_text()
#: Where this control plane's resident helper listens in the sandbox (the helper checks the name).
HELPER_SOCKET = f"/run/paddock-desktop/helper-{hashlib.sha256(HELPER_SOURCE.encode()).hexdigest()[:16]}.sock"
#: curl's exit statuses that mean no resident helper answered, so nothing was done and the operation may
#: run through ``python3 -c`` instead: 7 could not connect; 126/127 no runnable curl in the image.
_NOT_RESIDENT = frozenset({7, 126, 127})
#: curl's exit statuses for a reply lost after the helper accepted the request: 52 empty, 56 reset.
_REPLY_LOST = frozenset({52, 56})
#: The helper's operations that change nothing (starting screen-0 on first use aside), so safe to ask
#: again when a reply was lost.
READ_ONLY = frozenset(
    {
        "screenshot", "screen", "cursor", "clipboard_get", "windows", "window_current", "window_get",
        "window_geometry", "screens", "screen_get",
    }
)  # fmt: skip
#: How long one call may take through the resident helper (starting a screen, launching an application).
_RESIDENT_CALL_S = 120
DESKTOP_IMAGES = frozenset({"desktop:1"})
SCREEN_ID = re.compile(r"^screen-[0-7]$")
WINDOW_ID = re.compile(r"^(0x[0-9a-fA-F]{1,8}|[0-9]{1,10})$")
#: How far a template chain is followed to find the catalog image underneath.
MAX_TEMPLATE_DEPTH = 16

#: The helper's refusals, by status, as our domain errors.
_REFUSALS: dict[int, type[errors.PaddockError]] = {
    400: errors.ValidationFailed,
    404: errors.NotFound,
    409: errors.InvalidState,
}


def check_screen_id(screen_id: str | None) -> str:
    if screen_id is None or screen_id == "":
        return "screen-0"
    if not SCREEN_ID.match(screen_id):
        raise errors.ValidationFailed.field("screen_id", "must be one of screen-0 … screen-7")
    return screen_id


def check_window_id(window_id: str) -> str:
    """The id in canonical decimal: "0x1a00003" and "027262979" name the same window (an explicit base,
    since ``int(s, 0)`` refuses a decimal with a leading zero)."""
    if not WINDOW_ID.match(window_id):
        raise errors.ValidationFailed.field("window_id", "must be a window id (decimal, or 0x hex)")
    value = int(window_id, 16) if window_id.lower().startswith("0x") else int(window_id, 10)
    if not 0 < value < 2**32:
        raise errors.ValidationFailed.field("window_id", "must be a window id (decimal, or 0x hex)")
    return str(value)


def dump(body: BaseModel | None) -> dict[str, Any]:
    return body.model_dump(by_alias=True, exclude_none=True) if body is not None else {}


async def is_desktop_image(services: Services, image: str) -> bool:
    """A desktop catalog image, or a template built from one (directly or through other templates)."""
    for _ in range(MAX_TEMPLATE_DEPTH):
        if image in DESKTOP_IMAGES:
            return True
        if not image.startswith("tpl_"):
            return False
        async with services.sessions() as session:
            parent = await session.scalar(select(Template.from_image).where(Template.id == image))
        if parent is None:
            return False
        image = parent
    return False


async def desktop_sandbox(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    if not await is_desktop_image(services, sandbox.rootfs):
        raise errors.InvalidState(
            f"sandbox {sandbox_id} was not booted from a desktop image (rootfs desktop:1); "
            "computer use needs one"
        )
    return sandbox


async def perform(
    services: Services,
    user_id: str,
    sandbox_id: str,
    operation: str,
    args: dict[str, Any],
    screen_id: str | None = None,
) -> Any:
    """Runs one helper operation in the sandbox and returns its ``data``."""
    args = {**args, "screen_id": check_screen_id(screen_id)}
    sandbox = await desktop_sandbox(services, user_id, sandbox_id)
    link = await hostlink.for_host(services, sandbox.host_id)
    with Inflight(services, sandbox.id):
        try:
            result = await run_helper(link, sandbox.id, operation, json.dumps(args))
        except hostlink.SandboxGoneError as exc:
            raise errors.InvalidState(f"sandbox is gone: {exc}") from None
    return helper_answer(result)


class Exec(Protocol):
    """What the helper's calls need of a host link (``hostlink.HostLink.exec``)."""

    async def exec(
        self, sandbox_id: str, cmd: str, args: list[str], env: dict[str, str], stdin: str | None
    ) -> dict[str, Any]: ...


async def run_helper(link: Exec, sandbox_id: str, operation: str, arguments: str) -> dict[str, Any]:
    """One operation's exec result: through the resident helper, else through ``python3 -c``.

    A reply lost after the resident helper took the request (curl 52 or 56: the helper died under it)
    is retried the ``python3 -c`` way only for an operation that changes nothing, since another may
    already have taken effect; that one is answered as the 500 it is."""
    resident = [
        "-sS", "--max-time", str(_RESIDENT_CALL_S), "--unix-socket", HELPER_SOCKET,
        "-H", "Content-Type: application/json", "--data-binary", "@-", f"http://helper/{operation}",
    ]  # fmt: skip
    result = await link.exec(sandbox_id, "curl", resident, {}, arguments)
    code = result.get("exit_code")
    if code in _NOT_RESIDENT or result.get("error") or (code in _REPLY_LOST and operation in READ_ONLY):
        argv = ["-c", HELPER_SOURCE, operation, arguments, HELPER_SOCKET]
        result = await link.exec(sandbox_id, "python3", argv, {}, None)
    return result


def helper_answer(result: dict[str, Any]) -> Any:
    stdout = str(result.get("stdout") or "")
    last_line = stdout.strip().rsplit("\n", 1)[-1] if stdout.strip() else ""
    try:
        answer = json.loads(last_line) if last_line else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "data" in answer:
        return answer["data"]
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        refusal = answer["error"]
        message = str(refusal.get("message") or "the desktop refused the request")
        status = int(refusal.get("status") or 500)
        field = refusal.get("field")
        if status == 400 and isinstance(field, str):
            raise errors.ValidationFailed(message, fields={field: message})
        raise _REFUSALS.get(status, errors.ServerError)(message)
    stderr = str(result.get("stderr") or result.get("error") or "")[-400:]
    if result.get("exit_code") in _REPLY_LOST:
        raise errors.ServerError(
            f"the desktop helper's answer was lost (curl exit {result.get('exit_code')}); "
            "the action may have taken effect, so it was not repeated"
        )
    raise errors.ServerError(f"the desktop helper failed (exit {result.get('exit_code')}): {stderr}")


async def screenshot(
    services: Services,
    user_id: str,
    sandbox_id: str,
    *,
    screen_id: str | None,
    window_id: str | None,
    region: dict[str, int | None],
) -> bytes:
    args: dict[str, Any] = {key: value for key, value in region.items() if value is not None}
    if window_id is not None:
        args["window_id"] = check_window_id(window_id)
    data = await perform(services, user_id, sandbox_id, "screenshot", args, screen_id)
    try:
        return base64.b64decode(str(data["png"]), validate=True)
    except (KeyError, TypeError, binascii.Error, ValueError):
        raise errors.ServerError("the desktop helper answered no screenshot") from None


async def connect(services: Services, user_id: str, sandbox_id: str, screen_id: str) -> dict[str, Any]:
    """Starts the screen's VNC server and noVNC, and hands out a short-lived live-view link."""
    screen = await perform(services, user_id, sandbox_id, "connect", {}, screen_id)
    port = int(screen["novnc_port"])
    grant = desktop_access.issue(services.settings, sandbox_id, port)
    settings = services.settings
    base = f"{settings.ingress_scheme}://{port}-{sandbox_id}.{settings.ingress_url_domain}"
    prefix = f"{desktop_access.PREFIX}{grant.token}"
    websocket_path = f"{prefix.lstrip('/')}/websockify"
    # noVNC resolves its ``path`` against the page's own URL, which already carries the token.
    return {
        "screen_id": screen["screen_id"],
        "port": port,
        "path": "/" + websocket_path,
        "token": grant.token,
        "expires_at": rfc3339(dt.datetime.fromtimestamp(grant.expires_at_s, dt.UTC)),
        "url": f"{base}{prefix}/vnc.html?autoconnect=1&resize=scale&reconnect=1&path=websockify",
    }

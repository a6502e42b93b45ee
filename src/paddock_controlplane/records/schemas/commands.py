"""The exec request body (§10.11, §11.5)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from paddock_controlplane.records.schemas.base import Body

#: A signed link's life (``sandboxes/file_urls.py`` checks them; records import no role, so they are here).
DEFAULT_EXPIRES_IN_S = 3600
MAX_EXPIRES_IN_S = 7 * 86400


class ExecRequest(Body):
    cmd: StrictStr
    args: list[StrictStr] | None = None
    stream: StrictBool | None = None
    env: dict[str, StrictStr] | None = None
    stdin: StrictStr | None = None
    cwd: StrictStr | None = None
    user: StrictStr | StrictInt | None = None  # commands.check_user: a user name or a uid


class FileUrlRequest(Body):
    """``POST /v1/sandboxes/{id}/files/url``: a signed link to one path (``sandboxes/file_urls.py``)."""

    path: StrictStr
    operation: Literal["read", "write"] = "read"
    expires_in_s: StrictInt = Field(default=DEFAULT_EXPIRES_IN_S, ge=1, le=MAX_EXPIRES_IN_S)

"""The exec request body (§10.11, §11.5)."""

from __future__ import annotations

from pydantic import StrictBool, StrictInt, StrictStr

from paddock_controlplane.records.schemas.base import Body


class ExecRequest(Body):
    cmd: StrictStr
    args: list[StrictStr] | None = None
    stream: StrictBool | None = None
    env: dict[str, StrictStr] | None = None
    stdin: StrictStr | None = None
    cwd: StrictStr | None = None
    user: StrictStr | StrictInt | None = None  # commands.check_user: a user name or a uid

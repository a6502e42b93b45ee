"""Who is calling: the principal an API key or a delegated access token resolves to (spec §3, §12.1).

It lives in ``records`` because the services' hot-path cache holds principals; ``resources/accounts.py``
resolves keys to them and ``resources/access_tokens.py`` tokens.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from paddock_core import errors


@dataclass(frozen=True)
class Principal:
    """Who is calling: resolved from ``X-Api-Key`` once per request.

    An account key acts on everything its user owns. A delegated access token (spec §12.1,
    ``access_tokens.py``) carries ``sandbox_id``: it acts as the sandbox's owner, on that sandbox only.
    """

    user_id: str
    plan_id: str
    key_id: str
    #: The one sandbox a delegated access token is bound to; ``None`` for an account key.
    sandbox_id: str | None = None
    #: When a delegated token stops being valid, checked on every use (the cache outlives no token).
    expires_at: dt.datetime | None = None

    def require_scope(self, sandbox_id: str | None) -> None:
        """May this caller act here? ``sandbox_id`` is the sandbox a route works on, ``None`` for an
        account-level route. A token gets 404 for any other sandbox — answered exactly like one that is
        not the caller's (§3), so a token learns nothing about its owner's other sandboxes — and 403
        ``FORBIDDEN`` for account-level routes and operations the route did not open to tokens."""
        if self.sandbox_id is None:
            return
        if sandbox_id is None:
            raise errors.Forbidden("a sandbox access token cannot call this operation")
        if sandbox_id != self.sandbox_id:
            raise errors.NotFound("sandbox not found")

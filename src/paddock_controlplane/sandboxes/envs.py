"""A sandbox's environment variables: sealed at rest, opened for a command, overridden per exec.

Values are sealed with the control plane's secret box (``PADDOCK_CP_SECRET_KEY``), so a database dump
alone does not reveal them; the row keeps the key names in the clear for the views.
"""

from __future__ import annotations

import json

from paddock_controlplane.records import validation
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_core import errors


def seal(services: Services, envs: dict[str, str]) -> str | None:
    return services.secret_box.seal(json.dumps(envs)) if envs else None


def open_sealed(services: Services, sandbox: Sandbox) -> dict[str, str]:
    if not sandbox.envs_sealed:
        return {}
    return dict(json.loads(services.secret_box.open(sandbox.envs_sealed)))


def merged(services: Services, sandbox: Sandbox, overrides: dict[str, str] | None) -> dict[str, str]:
    """The sandbox's env with an exec's ``env`` over it; an exec may only override declared keys."""
    env = open_sealed(services, sandbox)
    if overrides:
        for key in overrides:
            if key not in env:
                raise errors.ValidationFailed.field(
                    f"env.{key}",
                    "not declared on the sandbox; declare it at create (envs: {KEY: default}) to override it per exec",
                )
        validation.envs({**env, **overrides})
        env.update(overrides)
    return env

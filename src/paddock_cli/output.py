"""What the client commands share: exit codes, SDK errors → messages, JSON or rich output, config."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import IntEnum
from typing import Any

import typer


class ExitCode(IntEnum):
    """Exit codes scripts can rely on (``paddock sandbox exec`` exits with the command's own code)."""

    OK = 0
    API_ERROR = 1  # the server answered with an error (4xx/5xx other than 404)
    USAGE = 2  # bad flags or arguments (also typer's own usage errors)
    UNREACHABLE = 3  # no answer: connection refused, timeout
    NOT_FOUND = 4  # the sandbox, endpoint or file does not exist (404)
    FAILED = 5  # a wait ended badly: sandbox failed, timed out, deployment failed
    PAYMENT = 6  # deploy: not enough tokens or gas, or the gateway refused the payment
    COMMAND_ERROR = 127  # exec: the command could not start or was cut off (sandbox paused …)


@dataclasses.dataclass
class Config:
    """Global options, set by the ``paddock`` callback from flags or the environment."""

    url: str | None = None
    api_key: str | None = None


CONFIG = Config()


def client() -> Any:
    """The SDK's client for the configured server. The SDK (and httpx under it) is imported here, by the
    commands that talk to the server, not when ``paddock`` starts: ``--help`` and the server and admin
    commands never need it."""
    import paddock

    show_server_warnings()
    return paddock.Client(CONFIG.url, CONFIG.api_key)


_warnings_shown = False


def show_server_warnings() -> None:
    """The server's ``Warning`` headers (``paddock.PaddockWarning``, e.g. an unknown body field it
    ignored) as ``warning: …`` lines on stderr, every time; other warnings as Python shows them.
    Called where a command makes its SDK client (it imports the SDK); once per process."""
    global _warnings_shown
    if _warnings_shown:
        return
    _warnings_shown = True

    import warnings

    import paddock

    shown = warnings.showwarning

    def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if issubclass(category, paddock.PaddockWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show
    warnings.simplefilter("always", paddock.PaddockWarning)


def fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(int(code))


@contextmanager
def api_errors() -> Iterator[None]:
    """Turn SDK exceptions into one line on stderr and the documented exit code."""
    import paddock

    try:
        yield
    except paddock.NotFoundError as exc:
        raise fail(exc.message, ExitCode.NOT_FOUND) from None
    except paddock.APIError as exc:
        # a field's reason the message already states is not said twice
        details = "; ".join(f"{k}: {v}" for k, v in exc.fields.items() if f"{k}: {v}" not in exc.message)
        suffix = f" ({details})" if details else ""
        raise fail(
            f"{exc.status} {exc.code or ''} {exc.message}{suffix}".replace("  ", " "), ExitCode.API_ERROR
        ) from None
    except paddock.TransportError as exc:
        raise fail(str(exc), ExitCode.UNREACHABLE) from None  # names the URL tried
    except (paddock.SandboxStateError, paddock.WaitTimeoutError, paddock.DeploymentFailedError) as exc:
        raise fail(str(exc), ExitCode.FAILED) from None
    except paddock.PaymentError as exc:
        raise fail(str(exc), ExitCode.PAYMENT) from None
    except paddock.PaddockError as exc:
        raise fail(str(exc), ExitCode.API_ERROR) from None


def plain(value: Any) -> Any:
    """Dataclasses (with their ``extra`` folded back in) and containers as JSON-ready values. A read the
    SDK returns as a WireView (whoami, rootfs, a deployment …) prints the JSON it came from, as when the
    SDK returned dicts, so ``--json`` output is unchanged (nulls included)."""
    from paddock._models import WireView  # the values printed come from the SDK: already imported

    if isinstance(value, WireView):
        return plain(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "extra"}
        data.update(plain(getattr(value, "extra", {})))
        return {k: v for k, v in data.items() if v is not None}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(plain(value), indent=2, sort_keys=True) + "\n")


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Plain columns, two spaces apart, nothing truncated or wrapped whatever the terminal's width, so an
    id is always whole and ``awk '{print $1}'`` gets it (a wrapping table split long ids over lines)."""
    cells = [[str(c) for c in columns]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        padded = [cell.ljust(width) for cell, width in zip(line, widths, strict=True)]
        typer.echo("  ".join(padded).rstrip())


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        if value not in (None, [], ""):
            typer.echo(f"{key.ljust(width)}  {', '.join(value) if isinstance(value, list) else value}")


def emit(value: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    if as_json:
        print_json(value)
    else:
        render(value)


def key_values(items: Sequence[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"{option} takes KEY=VALUE, got {item!r}", ExitCode.USAGE)
        out[key] = value
    return out


JSON_OPTION = typer.Option(False, "--json", help="Print JSON (stable field names) for scripts.")

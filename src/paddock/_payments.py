"""The local record of payments ``GatewayClient`` made, so a retry never pays twice.

A transfer is written here, signed, **before** it is broadcast; its state then moves
``signed → sent → mined → resolved``. Until it is ``resolved`` (the gateway accepted it, or said it
was already credited) every ``deploy`` by that wallet to that gateway resubmits this same transaction
hash instead of paying again — across retries, crashes and new processes. A ``signed`` transfer that
never reached the chain is rebroadcast byte for byte (same nonce: it can land once at most). Only a
transfer that provably moved nothing (``reverted``, or ``dropped`` because its nonce went to another
transaction) lets a new payment be made.

One JSON file, rewritten atomically under an exclusive lock (``fcntl.flock``); default
``~/.paddock/gateway-payments.json``, or ``PADDOCK_PAYMENTS_FILE``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV_PAYMENTS_FILE = "PADDOCK_PAYMENTS_FILE"
UNRESOLVED = ("signed", "sent", "mined")


def default_path() -> Path:
    configured = os.environ.get(ENV_PAYMENTS_FILE)
    return Path(configured) if configured else Path.home() / ".paddock" / "gateway-payments.json"


@dataclass
class Payment:
    gateway: str
    wallet: str  # lowercase
    chain: str
    token: str
    tx_hash: str  # lowercase 0x…
    raw_tx: str  # the signed transaction, to rebroadcast exactly
    nonce: int
    amount_token: str
    state: str = "signed"
    created_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    note: str = ""


class PaymentLedger:
    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path.with_suffix(self.path.suffix + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries: list[dict[str, Any]] = (
                    json.loads(self.path.read_text()) if self.path.exists() else []
                )
                before = json.dumps(entries)
                yield entries
                if json.dumps(entries) != before:
                    scratch = self.path.with_suffix(".tmp")
                    scratch.write_text(json.dumps(entries, indent=2))
                    os.chmod(scratch, 0o600)
                    os.replace(scratch, self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def record(self, payment: Payment) -> None:
        with self._locked() as entries:
            entries.append(asdict(payment))

    def set_state(self, tx_hash: str, state: str, note: str = "") -> None:
        with self._locked() as entries:
            for entry in entries:
                if entry["tx_hash"] == tx_hash.lower():
                    entry["state"] = state
                    entry["note"] = note or entry.get("note", "")

    def unresolved(self, gateway: str, wallet: str) -> list[Payment]:
        """This wallet's payments to this gateway that the gateway has not accepted yet, oldest first."""
        with self._locked() as entries:
            return [
                Payment(**entry)
                for entry in entries
                if entry["gateway"] == gateway
                and entry["wallet"] == wallet.lower()
                and entry["state"] in UNRESOLVED
            ]

    def all(self) -> list[Payment]:
        with self._locked() as entries:
            return [Payment(**entry) for entry in entries]

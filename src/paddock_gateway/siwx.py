"""x402's ``sign-in-with-x`` extension (SIWx): a wallet that has paid manages its projects with a signed
CAIP-122 / EIP-4361 ("Sign-In with Ethereum") proof instead of the seed's per-request headers.

The gateway declares the extension in the deploy's ``PAYMENT-REQUIRED`` (``extensions["sign-in-with-x"]``)
and in the body of a 401 ``auth_missing`` on the routes that take it, as x402's server does: ``info``
(``domain`` and ``uri`` of the gateway's public URL, ``version`` 1, a fresh ``nonce``, ``issuedAt``,
``expirationTime``, ``statement``, ``resources``), ``supportedChains`` (``eip155:<id>`` of each chain,
``type`` ``eip191``) and the payload's JSON schema. The client signs the EIP-4361 message built from those
fields, with its chosen chain and its address, and sends them back in the ``SIGN-IN-WITH-X`` header:
standard base64 of ``{domain, address, uri, version, chainId, type, nonce, issuedAt, [statement,
expirationTime, notBefore, requestId, resources], signature}``.

Checks, in x402's order (``validate_siwx_message`` then ``verify_siwx_signature``), the first failure
deciding 401 ``auth_siwx_rejected`` with x402's reason:

1. the header is strict base64 of a JSON object with every field well-formed
   (``invalid_siwx_payload``, the gateway's own reason, with ``field``);
2. ``domain`` is the public URL's host (``invalid_siwx_domain_mismatch``), ``uri``'s origin is the public
   URL's (``invalid_siwx_uri_mismatch``);
3. ``issuedAt`` is a timestamp (``invalid_siwx_issued_at``) at most ``MAX_AGE_S`` old
   (``invalid_siwx_issued_at_too_old``) and not in the future beyond the auth skew
   (``invalid_siwx_issued_at_in_future``); ``expirationTime`` not passed (``invalid_siwx_expired``),
   ``notBefore`` passed (``invalid_siwx_not_yet_valid``);
4. ``chainId`` is ``eip155:<n>`` (``invalid_siwx_chain_id``) of one of the gateway's chains
   (``invalid_siwx_unsupported_chain``), ``type`` is ``eip191``;
5. the signature: EIP-191 over the EIP-4361 message, by the address's key or, for a smart wallet, accepted
   on that chain (EIP-1271, ERC-6492; see ``signatures``) (``invalid_siwx_signature``; a chain that cannot
   be asked: ``invalid_siwx_verifier_error``);
6. the wallet has paid this gateway (a payment in its ledger, or an ``upto`` authorisation) (``siwx_payment_required``, the gateway's
   own: SIWx is for returning payers);
7. the nonce is taken, atomically, once ever (``invalid_siwx_nonce``): an accepted proof cannot be sent
   again. Nonces are kept ``MAX_AGE_S`` + the skew, after which step 3 refuses their proofs anyway.

Forged proofs never reach step 7, so they cannot burn a nonce.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_gateway.adapters.chain import ChainError
from paddock_gateway.auth import Caller, eip191_digest
from paddock_gateway.errors import AuthError
from paddock_gateway.models import Payment, SiwxNonce, X402Upto
from paddock_gateway.registry import Registry
from paddock_gateway.signatures import SignatureVerifier, recover

SIGN_IN_WITH_X = "sign-in-with-x"
HEADER = "SIGN-IN-WITH-X"
STATEMENT = "Sign in to manage the Paddock projects this wallet paid for"
#: x402's default: a proof is accepted for five minutes after ``issuedAt``.
MAX_AGE_S = 300
MAX_HEADER_CHARS = 16_384
MAX_RESOURCES = 16

ADDRESS_RE = re.compile(r"^0x[0-9a-fA-F]{40}$")
#: EIP-4361: at least 8 alphanumeric characters.
NONCE_RE = re.compile(r"^[A-Za-z0-9]{8,128}$")
CHAIN_RE = re.compile(r"^eip155:([0-9]{1,18})$")
SIGNATURE_RE = re.compile(r"^0x(?:[0-9a-fA-F]{2}){64,2048}$")
#: One line of printable text: nothing that could forge another line of the signed message.
LINE_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,512}$")
TIMESTAMP_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(?:Z|[+-][0-9]{2}:[0-9]{2})$")

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "domain": {"type": "string"},
        "address": {"type": "string"},
        "statement": {"type": "string"},
        "uri": {"type": "string", "format": "uri"},
        "version": {"type": "string"},
        "chainId": {"type": "string"},
        "type": {"type": "string"},
        "nonce": {"type": "string"},
        "issuedAt": {"type": "string", "format": "date-time"},
        "expirationTime": {"type": "string", "format": "date-time"},
        "notBefore": {"type": "string", "format": "date-time"},
        "requestId": {"type": "string"},
        "resources": {"type": "array", "items": {"type": "string", "format": "uri"}},
        "signature": {"type": "string"},
    },
    "required": ["domain", "address", "uri", "version", "chainId", "type", "nonce", "issuedAt", "signature"],
}


def rejected(reason: str, field: str | None = None) -> AuthError:
    error = AuthError("auth_siwx_rejected", reason=reason)
    if field is not None:
        error.extra["field"] = field
    return error


def iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def declaration(public_url: str, registry: Registry, now: dt.datetime, resource: str = "") -> dict[str, Any]:
    """``extensions["sign-in-with-x"]`` as x402's server enriches it: a fresh challenge."""
    split = urlsplit(public_url)
    uri = f"{split.scheme}://{split.netloc}{resource}"
    info = {
        "domain": split.netloc,
        "uri": uri,
        "statement": STATEMENT,
        "version": "1",
        "nonce": secrets.token_hex(16),
        "issuedAt": iso(now),
        "expirationTime": iso(now + dt.timedelta(seconds=MAX_AGE_S)),
        "resources": [uri],
    }
    chains = [{"chainId": f"eip155:{chain.chain_id}", "type": "eip191"} for chain in registry.ordered()]
    return {"info": info, "supportedChains": chains, "schema": SCHEMA}


@dataclass(frozen=True)
class Proof:
    """A parsed ``SIGN-IN-WITH-X`` payload; strings exactly as sent (the message is built from them)."""

    domain: str
    address: str
    uri: str
    version: str
    chain_id: str
    type: str
    nonce: str
    issued_at: str
    signature: bytes
    statement: str | None = None
    expiration_time: str | None = None
    not_before: str | None = None
    request_id: str | None = None
    resources: tuple[str, ...] = ()

    def message(self) -> str:
        """The EIP-4361 message, laid out as EIP-4361's ABNF (and the ``siwe`` packages) lay it out."""
        prefix = f"{self.domain} wants you to sign in with your Ethereum account:\n{self.address}"
        prefix = f"{prefix}\n\n{self.statement}" if self.statement else prefix + "\n"
        lines = [
            f"URI: {self.uri}",
            f"Version: {self.version}",
            f"Chain ID: {self.chain_number}",
            f"Nonce: {self.nonce}",
            f"Issued At: {self.issued_at}",
        ]
        if self.expiration_time:
            lines.append(f"Expiration Time: {self.expiration_time}")
        if self.not_before:
            lines.append(f"Not Before: {self.not_before}")
        if self.request_id:
            lines.append(f"Request ID: {self.request_id}")
        if self.resources:
            lines.append("\n".join(["Resources:", *(f"- {resource}" for resource in self.resources)]))
        return prefix + "\n\n" + "\n".join(lines)

    @property
    def chain_number(self) -> int:
        match = CHAIN_RE.match(self.chain_id)
        return int(match.group(1)) if match else 0


def _text(
    payload: dict[str, Any], key: str, *, required: bool = True, pattern: re.Pattern[str] = LINE_RE
) -> Any:
    value = payload.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not pattern.match(value):
        raise rejected("invalid_siwx_payload", key)
    return value


def parse(header: str) -> Proof:
    """Step 1: the header's syntax; every malformed part is 401 ``invalid_siwx_payload`` naming it."""
    if len(header) > MAX_HEADER_CHARS:
        raise rejected("invalid_siwx_payload", "header")
    try:
        payload = json.loads(base64.b64decode(header.strip(), validate=True).decode("utf-8"))
    except (binascii.Error, ValueError, RecursionError):  # not base64, not UTF-8, not JSON, nested too deep
        raise rejected("invalid_siwx_payload", "header") from None
    if not isinstance(payload, dict):
        raise rejected("invalid_siwx_payload", "header")
    resources = payload.get("resources")
    if resources is not None and not (
        isinstance(resources, list)
        and len(resources) <= MAX_RESOURCES
        and all(isinstance(item, str) and LINE_RE.match(item) for item in resources)
    ):
        raise rejected("invalid_siwx_payload", "resources")
    return Proof(
        domain=_text(payload, "domain"),
        address=_text(payload, "address", pattern=ADDRESS_RE),
        uri=_text(payload, "uri"),
        version=_text(payload, "version"),
        chain_id=_text(payload, "chainId"),
        type=_text(payload, "type"),
        nonce=_text(payload, "nonce", pattern=NONCE_RE),
        issued_at=_text(payload, "issuedAt"),
        signature=bytes.fromhex(_text(payload, "signature", pattern=SIGNATURE_RE)[2:]),
        statement=_text(payload, "statement", required=False),
        expiration_time=_text(payload, "expirationTime", required=False),
        not_before=_text(payload, "notBefore", required=False),
        request_id=_text(payload, "requestId", required=False),
        resources=tuple(resources or ()),
    )


def _moment(value: str, reason: str) -> dt.datetime:
    if not TIMESTAMP_RE.match(value):
        raise rejected(reason)
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise rejected(reason) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def validate(proof: Proof, public_url: str, registry: Registry, now: dt.datetime, skew_s: float) -> None:
    """Steps 2–4: the message is for this gateway, now, and one of its chains."""
    expected = urlsplit(public_url)
    if proof.domain != expected.netloc:
        raise rejected("invalid_siwx_domain_mismatch")
    uri = urlsplit(proof.uri)
    if not uri.scheme or not uri.netloc or (uri.scheme, uri.netloc) != (expected.scheme, expected.netloc):
        raise rejected("invalid_siwx_uri_mismatch")
    if proof.version != "1":
        raise rejected("invalid_siwx_payload", "version")
    issued = _moment(proof.issued_at, "invalid_siwx_issued_at")
    age_s = (now - issued).total_seconds()
    if age_s > MAX_AGE_S:
        raise rejected("invalid_siwx_issued_at_too_old")
    if age_s < -skew_s:
        raise rejected("invalid_siwx_issued_at_in_future")
    if proof.expiration_time and _moment(proof.expiration_time, "invalid_siwx_expiration_time") < now:
        raise rejected("invalid_siwx_expired")
    if proof.not_before and _moment(proof.not_before, "invalid_siwx_not_before") > now:
        raise rejected("invalid_siwx_not_yet_valid")
    if not CHAIN_RE.match(proof.chain_id):
        raise rejected("invalid_siwx_chain_id")
    if chain_named(proof, registry) is None:
        raise rejected("invalid_siwx_unsupported_chain")
    if proof.type != "eip191":
        raise rejected("invalid_siwx_payload", "type")


def chain_named(proof: Proof, registry: Registry) -> str | None:
    return next((chain.name for chain in registry.ordered() if chain.chain_id == proof.chain_number), None)


@dataclass(frozen=True)
class SiwxContext:
    """What the checks need from the running gateway."""

    sessions: async_sessionmaker[AsyncSession]
    registry: Registry
    public_url: str
    verifier: SignatureVerifier
    chains: Mapping[str, Any]  # chain name → ChainClient
    skew_s: float


async def authenticate(context: SiwxContext, header: str, now: dt.datetime) -> Caller:
    """Steps 1–7; the caller on success, else 401 ``auth_siwx_rejected`` with the reason."""
    proof = parse(header)
    validate(proof, context.public_url, context.registry, now, context.skew_s)
    wallet = proof.address.lower()
    digest = eip191_digest(proof.message())
    if recover(digest, proof.signature) != wallet:
        chain = chain_named(proof, context.registry)
        assert chain is not None  # validate() checked it
        try:
            verdict = await context.verifier.verify(
                context.chains[chain], proof.address, digest, proof.signature
            )
        except ChainError as exc:
            raise rejected("invalid_siwx_verifier_error") from exc
        if not verdict.valid:
            raise rejected("invalid_siwx_signature")
    async with context.sessions() as session:
        paid = await session.scalar(select(Payment.tx_hash).where(Payment.wallet == wallet).limit(1))
        if paid is None:  # an ``upto`` payer has authorised, not paid yet: its authorisation counts
            paid = await session.scalar(select(X402Upto.id).where(X402Upto.wallet == wallet).limit(1))
    if paid is None:
        raise rejected("siwx_payment_required")
    try:
        async with transaction(context.sessions) as session:
            session.add(SiwxNonce(nonce=proof.nonce, wallet=wallet, created_at=now))
    except IntegrityError as exc:
        raise rejected("invalid_siwx_nonce") from exc
    return Caller(wallet=wallet)


async def prune_nonces(sessions: async_sessionmaker[AsyncSession], now: dt.datetime, skew_s: float) -> int:
    """Forget nonces whose proofs step 3 refuses anyway (older than ``MAX_AGE_S`` + the skew)."""
    cutoff = now - dt.timedelta(seconds=MAX_AGE_S + skew_s)
    async with transaction(sessions) as session:
        result = await session.execute(delete(SiwxNonce).where(SiwxNonce.created_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)

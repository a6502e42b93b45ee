"""The gateway's tables (its own database; migrations in ``migrations/``).

Money is integers: token amounts in raw units (10^-6 USD), credit balances in micro-credits
(10^-6 credits; 1 raw unit of a 6-decimal token buys exactly 100 micro-credits).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TS = sa.DateTime(timezone=True)


class Base(DeclarativeBase):
    pass


class Nonce(Base):
    """A consumed auth nonce; the primary key makes consumption atomic (§3.4 step 5)."""

    __tablename__ = "gw_nonces"
    wallet: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    nonce: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(TS, index=True)


class SiwxNonce(Base):
    """A sign-in-with-x nonce that authenticated a request; the primary key makes it single-use."""

    __tablename__ = "gw_siwx_nonces"
    nonce: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    wallet: Mapped[str] = mapped_column(sa.String(42))
    created_at: Mapped[dt.datetime] = mapped_column(TS, index=True)


class Payment(Base):
    """The payment ledger (§8.1): one row per transaction hash, unique across chains."""

    __tablename__ = "gw_payments"
    tx_hash: Mapped[str] = mapped_column(sa.String(66), primary_key=True)
    wallet: Mapped[str] = mapped_column(sa.String(42), index=True)
    chain: Mapped[str] = mapped_column(sa.String(16))
    token: Mapped[str] = mapped_column(sa.String(8))
    amount_raw: Mapped[int] = mapped_column(sa.BigInteger)
    state: Mapped[str] = mapped_column(sa.String(16))  # verified → credited → deployed, or → rented
    project_id: Mapped[str | None] = mapped_column(sa.String(64))
    deployment_id: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


class X402Authorization(Base):
    """An x402 authorization the gateway has taken on: the primary key (network, asset, payer, nonce) is
    what the chain itself makes single-use, so inserting it first lets exactly one of any number of
    concurrent requests carrying the same authorization go on to settle it. ``asset`` is the contract
    that holds the nonce: the token for EIP-3009, Permit2 for Permit2 (whose nonces are the owner's
    across all tokens; the nonce is then its uint256 as 32-byte hex)."""

    __tablename__ = "gw_x402_authorizations"
    network: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    asset: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    payer: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    nonce: Mapped[str] = mapped_column(sa.String(66), primary_key=True)
    state: Mapped[str] = mapped_column(sa.String(16))  # settling → submitted → settled
    tx_hash: Mapped[str | None] = mapped_column(sa.String(66))
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


class X402PaymentId(Base):
    """A paid deploy that carried x402's ``payment-identifier``: (wallet, id) is answered once. ``pending``
    while the first request runs; ``done`` holds its answer (the 200's body and ``PAYMENT-RESPONSE``),
    which a retry of the same payment gets again. ``terms`` is the payment's fingerprint
    (``SignedPayment.terms``): the same id with other terms is refused."""

    __tablename__ = "gw_x402_payment_ids"
    wallet: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    payment_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    terms: Mapped[str] = mapped_column(sa.String(64))
    state: Mapped[str] = mapped_column(sa.String(16))  # pending → done | sent
    nonce: Mapped[str | None] = mapped_column(sa.String(66))  # the authorization's, once sent
    project_id: Mapped[str | None] = mapped_column(sa.String(64))
    deployment_id: Mapped[str | None] = mapped_column(sa.String(64))
    message: Mapped[str | None] = mapped_column(sa.Text)
    tx_hash: Mapped[str | None] = mapped_column(sa.String(66))
    payment_response: Mapped[str | None] = mapped_column(sa.Text)  # the header's base64 value
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


class X402Upto(Base):
    """An x402 ``upto`` authorisation funding a project's runtime (``upto.py``): the maximum the payer
    authorised (``authorized_raw``), the price of the period it covers (``price_raw`` for ``period_s``
    seconds; the per-second rate is their ratio), and once settled what was consumed and moved
    (``settled_raw``, never above ``authorized_raw``). ``state``: open → settling → submitted → settled,
    or failed (nothing moved). Moving a row out of ``open`` is a conditional UPDATE, so of any number of
    workers exactly one settles it. (``network``, ``payer``, ``nonce``) is the Permit2 nonce, unique."""

    __tablename__ = "gw_x402_upto"
    __table_args__ = (sa.UniqueConstraint("network", "payer", "nonce"),)
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    project_id: Mapped[str] = mapped_column(sa.String(64), index=True)
    wallet: Mapped[str] = mapped_column(sa.String(42))
    network: Mapped[str] = mapped_column(sa.String(32))
    chain: Mapped[str] = mapped_column(sa.String(16))
    token: Mapped[str] = mapped_column(sa.String(8))
    payer: Mapped[str] = mapped_column(sa.String(42))
    nonce: Mapped[str] = mapped_column(sa.String(66))
    #: The signed permit as x402 sent it (token, amount, nonce, deadline, witness; signature hex).
    permit: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    authorized_raw: Mapped[int] = mapped_column(sa.BigInteger)
    price_raw: Mapped[int] = mapped_column(sa.BigInteger)
    period_s: Mapped[int] = mapped_column(sa.BigInteger)
    started_at: Mapped[dt.datetime] = mapped_column(TS)
    #: When it must be settled at the latest: the period's end, or earlier if the permit's deadline is.
    due_at: Mapped[dt.datetime] = mapped_column(TS, index=True)
    #: Set when the project is deleted: consumption stops there and it is settled at once.
    stopped_at: Mapped[dt.datetime | None] = mapped_column(TS)
    state: Mapped[str] = mapped_column(sa.String(16), index=True)
    reason: Mapped[str | None] = mapped_column(sa.String(16))  # period_end | deleted | exhausted | deadline
    consumed_s: Mapped[int | None] = mapped_column(sa.BigInteger)
    settled_raw: Mapped[int | None] = mapped_column(sa.BigInteger)
    tx_hash: Mapped[str | None] = mapped_column(sa.String(66))
    error: Mapped[str | None] = mapped_column(sa.String(64))
    settled_at: Mapped[dt.datetime | None] = mapped_column(TS)
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


class Wallet(Base):
    """The running credit balance of a wallet; the sum of its ``CreditEntry`` rows."""

    __tablename__ = "gw_wallets"
    address: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    balance_micro: Mapped[int] = mapped_column(sa.BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


class CreditEntry(Base):
    """One credit movement. ``idempotency_key`` is the tx hash for a top-up, project+hour for usage."""

    __tablename__ = "gw_credit_entries"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    wallet: Mapped[str] = mapped_column(sa.String(42), index=True)
    amount_micro: Mapped[int] = mapped_column(sa.BigInteger)
    kind: Mapped[str] = mapped_column(sa.String(16))  # topup | usage
    idempotency_key: Mapped[str] = mapped_column(sa.String(128), unique=True)
    project_id: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(TS)


class Project(Base):
    """A project deployed through the gateway. ``name_key`` (lowercased name) is NULL once deleted."""

    __tablename__ = "gw_projects"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    wallet: Mapped[str] = mapped_column(sa.String(42), index=True)
    name: Mapped[str] = mapped_column(sa.String(32))
    name_key: Mapped[str | None] = mapped_column(sa.String(32), unique=True)
    display_name: Mapped[str] = mapped_column(sa.String(100))
    description: Mapped[str | None] = mapped_column(sa.Text)
    monthly_raw: Mapped[int] = mapped_column(sa.BigInteger)
    state: Mapped[str] = mapped_column(sa.String(16))  # live | paused | deleting | deleted
    latest_deployment_id: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    metered_until: Mapped[dt.datetime] = mapped_column(TS)
    hours_metered: Mapped[int] = mapped_column(sa.Integer)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(TS)


class Deployment(Base):
    """A deployment of a project; who deployed it decides who may read its status."""

    __tablename__ = "gw_deployments"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("gw_projects.id"), index=True)
    wallet: Mapped[str] = mapped_column(sa.String(42))
    created_at: Mapped[dt.datetime] = mapped_column(TS)


class SandboxDeployment(Base):
    """The hosting side's record of a deployment on a Paddock sandbox (owned by ``sandbox_hosting``)."""

    __tablename__ = "gw_sandbox_deployments"
    deployment_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(sa.String(64), index=True)
    sandbox_id: Mapped[str | None] = mapped_column(sa.String(80))
    status: Mapped[str] = mapped_column(sa.String(16))  # queued building deploying active sleeping failed …
    url: Mapped[str | None] = mapped_column(sa.Text)
    reason: Mapped[str | None] = mapped_column(sa.Text)
    plan: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


class AgentSandbox(Base):
    """A sandbox a wallet rented by x402 (``agent_sandboxes``): the control plane's sandbox ``id``, created
    under the gateway's account; the per-second ``rate_raw`` of its shape; ``block_s`` seconds of running
    paid (``exact``, ``tx_hash``) or authorised (``upto``, ``upto_id``); ``run_s`` seconds of running in
    closed intervals plus, while running, the open one from ``running_since``. ``state``: running ↔
    paused → deleted, or spent (paused by the worker when the paid time is used up)."""

    __tablename__ = "gw_agent_sandboxes"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    wallet: Mapped[str] = mapped_column(sa.String(42), index=True)
    name: Mapped[str] = mapped_column(sa.String(64))
    shape: Mapped[str] = mapped_column(sa.String(64))
    rootfs: Mapped[str] = mapped_column(sa.String(128))
    scheme: Mapped[str] = mapped_column(sa.String(8))
    rate_raw: Mapped[int] = mapped_column(sa.BigInteger)
    block_s: Mapped[int] = mapped_column(sa.BigInteger)
    amount_raw: Mapped[int] = mapped_column(sa.BigInteger)
    tx_hash: Mapped[str | None] = mapped_column(sa.String(66))
    upto_id: Mapped[str | None] = mapped_column(sa.String(36))
    state: Mapped[str] = mapped_column(sa.String(16), index=True)
    run_s: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    running_since: Mapped[dt.datetime | None] = mapped_column(TS)
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(TS)


class AgentSandboxRun(Base):
    """One running interval of a wallet's sandbox (``ended_at`` None while it runs): paused time is in
    none, so the runtime billed between two instants is the overlap of these with them."""

    __tablename__ = "gw_agent_sandbox_runs"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    sandbox_id: Mapped[str] = mapped_column(sa.String(64), index=True)
    started_at: Mapped[dt.datetime] = mapped_column(TS)
    ended_at: Mapped[dt.datetime | None] = mapped_column(TS)

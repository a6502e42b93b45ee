"""Control-plane tables. Every state change is written here first; the database is the truth."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from paddock_controlplane.records.app_ports import AppPorts
from paddock_core.timeutil import utcnow


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dt.datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class Plan(Base):
    __tablename__ = "plans"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    concurrent_sandboxes: Mapped[int] = mapped_column(Integer)
    sandboxes_per_day: Mapped[int] = mapped_column(Integer)
    networks_concurrent: Mapped[int] = mapped_column(Integer)
    networks_per_day: Mapped[int] = mapped_column(Integer)
    disks_concurrent: Mapped[int] = mapped_column(Integer)
    disks_per_day: Mapped[int] = mapped_column(Integer)
    templates_concurrent: Mapped[int] = mapped_column(Integer)
    templates_per_day: Mapped[int] = mapped_column(Integer)
    max_disk_mib: Mapped[int] = mapped_column(Integer)
    max_vcpu: Mapped[int] = mapped_column(Integer)
    max_mem_mib: Mapped[int] = mapped_column(Integer)
    webhook_endpoints: Mapped[int | None] = mapped_column(Integer, nullable=True)


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    #: Balance in micro-credits (100 credits = 1 USD), so per-second billing stays exact in integers.
    credits_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    #: Bumped by :func:`accounts.lock_user` so concurrent quota checks serialise per user.
    lock_version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    #: The first characters of the key, for recognising it in listings; the rest is never stored.
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class CreditEntry(Base):
    """The credit ledger: every change to a user's balance, signed, in micro-credits."""

    __tablename__ = "credit_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    ref: Mapped[str | None] = mapped_column(String(80), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Host(Base):
    __tablename__ = "hosts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(String(300))
    status: Mapped[str] = mapped_column(String(16), default="active")
    free_mib: Mapped[int] = mapped_column(Integer, default=0)
    total_mib: Mapped[int] = mapped_column(Integer, default=0)
    vm_count: Mapped[int] = mapped_column(Integer, default=0)
    rootfses: Mapped[list[Any]] = mapped_column(default=list)
    buildable: Mapped[list[Any]] = mapped_column(default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Set by an operator (``paddock admin host drain``): the host reports ``draining`` and gets no new
    # placements; its sandboxes keep running. Survives heartbeats and the host dying and returning.
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    last_heartbeat_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Sandbox(Base):
    __tablename__ = "sandboxes"
    __table_args__ = (
        Index(
            "uq_sandboxes_live_name",
            "user_id",
            "name",
            unique=True,
            sqlite_where=text("status NOT IN ('destroyed', 'failed')"),
            postgresql_where=text("status NOT IN ('destroyed', 'failed')"),
        ),
        Index("ix_sandboxes_user_created", "user_id", "created_at", "id"),
        Index("ix_sandboxes_status", "status"),
        # A heartbeat's host, a placement's leading hosts, a dead host's sandboxes (issue #36).
        Index("ix_sandboxes_host_status", "host_id", "status"),
        # The reconciler's idle and hibernate passes, every second: the few that asked, not all rows.
        Index(
            "ix_sandboxes_auto_pause",
            "status",
            sqlite_where=text("auto_pause_after_seconds IS NOT NULL"),
            postgresql_where=text("auto_pause_after_seconds IS NOT NULL"),
        ),
        Index(
            "ix_sandboxes_auto_hibernate",
            "status",
            sqlite_where=text("auto_hibernate_after_seconds IS NOT NULL"),
            postgresql_where=text("auto_hibernate_after_seconds IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    host_id: Mapped[str | None] = mapped_column(ForeignKey("hosts.id"), nullable=True)
    ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    shape: Mapped[str] = mapped_column(String(40))
    rootfs: Mapped[str] = mapped_column(String(100))
    vcpu: Mapped[int] = mapped_column(Integer)
    mem_mib: Mapped[int] = mapped_column(Integer)
    cpu_quota_pct: Mapped[int | None] = mapped_column(Integer, nullable=True)
    disk_mib: Mapped[int] = mapped_column(Integer)
    region: Mapped[str] = mapped_column(String(8))
    spawn_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    egress: Mapped[list[Any]] = mapped_column(default=list)
    #: Env values sealed with the server key; only ``env_keys`` is ever shown.
    envs_sealed: Mapped[str | None] = mapped_column(Text, nullable=True)
    env_keys: Mapped[list[Any]] = mapped_column(default=list)
    ssh_pubkeys: Mapped[list[Any]] = mapped_column(default=list)
    node_selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ingress_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    #: The ``Host`` the ingress sends its apps (``${PORT}`` the port), or None for the client's, and the
    #: ports whose app serves HTTPS itself (records/app_ports.py; migration 0030).
    ingress_host_header: Mapped[str | None] = mapped_column(String(255), nullable=True, default=None)
    ingress_https_ports: Mapped[list[int] | None] = mapped_column(JSON, nullable=True, default=None)
    bandwidth_quota_bytes: Mapped[int] = mapped_column(BigInteger, default=5 * 1024**3)
    bandwidth_used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    bandwidth_ingress_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    forked_from: Mapped[str | None] = mapped_column(String(40), nullable=True)
    auto_pause_after_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: Paused with nothing left running on its host but its disk (docs/hibernation.md); a resume boots it.
    hibernated: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Set by a frozen pause that asked for it: the reconciler hibernates the sandbox once it has been
    #: paused this long (cleared by the resume).
    auto_hibernate_after_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: What the idle auto-pause (``auto_pause_after_seconds``) does: ``pause`` (frozen; also when unset)
    #: or ``hibernate`` (docs/hibernation.md).
    on_idle: Mapped[str | None] = mapped_column(String(16), nullable=True)
    status_reason: Mapped[str | None] = mapped_column(String(300), nullable=True)
    oom_kills: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    running_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    paused_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    last_resumed_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    destroyed_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    last_activity_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    #: Compute is billed up to this instant; advanced by the billing pass while running.
    billed_until: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    #: The lifetime asked at create or fork (``timeout_s``): at ``end_at`` the reconciler's expiry pass
    #: destroys the sandbox, or pauses it when ``on_timeout`` is ``pause`` (hibernates it: ``hibernate``;
    #: then ``end_at`` is cleared).
    #: The E2B API's ``timeout`` is this same lifetime.
    timeout_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    on_timeout: Mapped[str | None] = mapped_column(String(16), nullable=True)
    end_at: Mapped[dt.datetime | None] = mapped_column(nullable=True, index=True)
    #: The caller's labels (``metadata`` on the wire: a bounded string map), filtered on by list.
    labels: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, key="labels", nullable=True)
    #: Private network memberships (read-only here; ``networks.py`` writes them). Loaded with the row.
    memberships: Mapped[list[NetworkMember]] = relationship(
        "NetworkMember", lazy="selectin", viewonly=True, order_by="NetworkMember.created_at"
    )

    @property
    def app_ports(self) -> AppPorts:
        return AppPorts.of(self.ingress_host_header, self.ingress_https_ports)


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_user_created", "user_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    url: Mapped[str] = mapped_column(String(2048))
    #: The signing secret sealed with the server key; shown in plaintext only by create.
    secret_sealed: Mapped[str] = mapped_column(Text)
    #: Subscribed actions; empty means every action.
    events: Mapped[list[Any]] = mapped_column(default=list)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    failure_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint: the outbox row, written in the transaction of the state change."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "created_at"),
        Index("ix_webhook_deliveries_created", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    user_id: Mapped[str] = mapped_column(String(40))
    event_action: Mapped[str] = mapped_column(String(64))
    #: The exact body bytes (UTF-8 JSON) sent on every attempt; fixed at emission.
    payload: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: A claimed attempt belongs to ``lease_token`` until ``lease_until``; then anyone may claim it.
    lease_until: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    lease_token: Mapped[str | None] = mapped_column(String(40), nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(300), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    #: When the delivery became ``delivered`` or ``failed`` (the 30-minute retention counts from here).
    finished_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class Network(Base):
    """A private network (§10.14). Deleting one keeps the row (``deleted_at``) for the daily cap."""

    __tablename__ = "networks"
    __table_args__ = (
        Index("ix_networks_user_created", "user_id", "created_at", "id"),
        # A user's live networks never overlap, so a sandbox can join several of them.
        Index(
            "uq_networks_live_cidr",
            "user_id",
            "cidr",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    #: The network's IPv4 block; members get addresses from it (the overlay IPs).
    cidr: Mapped[str] = mapped_column(String(43))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class NetworkMember(Base):
    """A sandbox's membership of a network and its overlay address (kept across host restarts)."""

    __tablename__ = "network_members"
    __table_args__ = (
        Index("uq_network_members_ip", "network_id", "ip", unique=True),
        Index("ix_network_members_sandbox", "sandbox_id"),
    )

    network_id: Mapped[str] = mapped_column(ForeignKey("networks.id"), primary_key=True)
    sandbox_id: Mapped[str] = mapped_column(ForeignKey("sandboxes.id"), primary_key=True)
    ip: Mapped[str] = mapped_column(String(64))
    #: ``pending`` until the host has programmed the interface, then ``active`` (§10.14).
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Disk(Base):
    """An S3 disk (§10.13). Deleting one keeps the row (``deleted_at``) for the daily cap."""

    __tablename__ = "disks"
    __table_args__ = (
        Index("ix_disks_user_created", "user_id", "created_at", "id"),
        Index(
            "uq_disks_live_name",
            "user_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(16))
    #: bucket, endpoint, region, use_path_style: shown as the disk's ``config``.
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: ``{"access_key", "secret_key"}`` sealed with the server key; never shown.
    credentials_sealed: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class SandboxDisk(Base):
    """A disk mounted in a sandbox at one path; one disk may be mounted at several (§11.10)."""

    __tablename__ = "sandbox_disks"
    __table_args__ = (Index("ix_sandbox_disks_disk", "disk_id"),)

    sandbox_id: Mapped[str] = mapped_column(ForeignKey("sandboxes.id"), primary_key=True)
    mount_path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    disk_id: Mapped[str] = mapped_column(ForeignKey("disks.id"))
    sub_path: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    #: ``pending`` until the host answers, then ``mounted`` or ``error`` (§10.1 DiskMountStatus).
    mount_status: Mapped[str] = mapped_column(String(16), default="pending")
    mount_error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Template(Base):
    """A Dockerfile and the image built from it (§10.12). Deleting one keeps the row (``deleted_at``)
    for the daily cap; its name is free again at once."""

    __tablename__ = "templates"
    __table_args__ = (
        Index("ix_templates_user_created", "user_id", "created_at", "id"),
        Index(
            "uq_templates_live_name",
            "user_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
        Index("ix_templates_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    #: The request's ``base`` after defaulting (what ``FROM base`` means).
    base: Mapped[str] = mapped_column(String(128))
    #: What ``FROM`` resolved to at submit: a catalog name or the id of the user's ready template.
    from_image: Mapped[str] = mapped_column(String(128))
    dockerfile: Mapped[str] = mapped_column(Text)
    #: The build context (a tar, maybe gzip-compressed) COPY/ADD read from, while the build needs it;
    #: deferred: only the build worker loads it.
    context: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    status: Mapped[str] = mapped_column(String(16))
    #: The attempt running or last run (0 before the first).
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    #: The host that builds it and then holds its image.
    host_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ext4_size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: A builder owns the build until then and renews it while it runs; a lapsed lease is claimed again.
    lease_until: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    built_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class TemplateLogLine(Base):
    """One line of a template's build log (§10.12 frame), in arrival order (``id``)."""

    __tablename__ = "template_log_lines"
    __table_args__ = (Index("ix_template_log_lines_template", "template_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    template_id: Mapped[str] = mapped_column(ForeignKey("templates.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    ts: Mapped[dt.datetime] = mapped_column()
    level: Mapped[str] = mapped_column(String(16))
    line: Mapped[str] = mapped_column(Text)

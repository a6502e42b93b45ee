"""The tables of local persistent volumes (issue #34, docs/volumes.md): an XFS filesystem in a file on
the host that made it, which outlives every sandbox it is mounted into.

``volumes``: one row per volume, ``creating`` while its host makes it, then ``ready`` (``deleting``
while its host removes it). ``host_id`` is where its file lives: a sandbox that mounts it runs there.
``volume_attachments``: one row per sandbox holding a volume, with its path and whether it is
read-only. A row whose sandbox is destroyed or failed no longer holds the volume (destroy does not
need to know about volumes); detach and volume deletion remove rows.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base
from paddock_core.timeutil import utcnow

CREATING = "creating"
READY = "ready"
DELETING = "deleting"
#: ``vol_`` and a ULID (``paddock_core.ids.new_id``): the host agent's pattern holds it.
ID_PREFIX = "vol_"


class Volume(Base):
    __tablename__ = "volumes"
    __table_args__ = (
        Index("ix_volumes_user_created", "user_id", "created_at", "id"),
        Index("uq_volumes_user_name", "user_id", "name", unique=True),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    status: Mapped[str] = mapped_column(String(16))
    host_id: Mapped[str] = mapped_column(String(64))
    size_mib: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: How far its stored bytes have been charged (resources/billing.py ``storage_pass``).
    billed_until: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class VolumeAttachment(Base):
    __tablename__ = "volume_attachments"
    __table_args__ = (Index("ix_volume_attachments_volume", "volume_id"),)

    sandbox_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    volume_id: Mapped[str] = mapped_column(ForeignKey("volumes.id"), primary_key=True)
    mount_path: Mapped[str] = mapped_column(String(4096))
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

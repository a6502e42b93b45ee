"""The table of snapshots (issue #34): a copy of a sandbox's disk, kept on the host that made it, which
outlives the sandbox and boots new sandboxes (``rootfs`` = its id or name).

A row is ``creating`` while its host copies the disk, then ``ready``; a snapshot whose copy failed is
removed. A row left ``creating`` by a process that died is settled by the reconciler (``ready`` if its
host holds it whole, else removed: ``workers/reconciler.py``, ``OrphanedSnapshots``). ``host_id`` is where the copy lives (a sandbox booted from it is placed there), ``image`` the
image its overlay is of (the host keeps it while the snapshot is booted from), ``disk_mib`` the size of
its disk (the least a sandbox booted from it gets), ``size_bytes`` what its image holds on the host
(blocks shared with the sandboxes booted from it, and its volumes' copies). Deleting one removes its
row.

``snapshot_volumes``: a snapshot taken with ``include_volumes`` keeps its own copy of each volume the
sandbox held (a volume on the snapshot's host, ``volume_id``, that no user sees or mounts), with the path
and mode it was held at; a sandbox booted from the snapshot gets a new volume copied from each.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base
from paddock_core.timeutil import utcnow

CREATING = "creating"
READY = "ready"
#: ``snap_`` and a ULID (``paddock_core.ids.new_id``): the host agent's pattern holds it.
ID_PREFIX = "snap_"


class Snapshot(Base):
    __tablename__ = "snapshots"
    __table_args__ = (
        Index("ix_snapshots_user_created", "user_id", "created_at", "id"),
        Index("uq_snapshots_user_name", "user_id", "name", unique=True),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str | None] = mapped_column(String(63), nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    host_id: Mapped[str] = mapped_column(String(64))
    source_sandbox_id: Mapped[str] = mapped_column(String(40))
    image: Mapped[str] = mapped_column(String(128))
    disk_mib: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: How far its stored bytes have been charged (resources/billing.py ``storage_pass``).
    billed_until: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class SnapshotVolume(Base):
    """A snapshot's copy of a volume its sandbox held (``include_volumes``), kept on the snapshot's host."""

    __tablename__ = "snapshot_volumes"

    snapshot_id: Mapped[str] = mapped_column(ForeignKey("snapshots.id"), primary_key=True)
    #: The copy's id on the host (a ``vol_`` id in its volume store, owned by the snapshot).
    volume_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    #: The volume it was copied from, and its name then (a boot's copy is named after it).
    source_volume_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(63))
    mount_path: Mapped[str] = mapped_column(String(4096))
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    size_mib: Mapped[int] = mapped_column(Integer)
    #: What the copy holds on the host (counted in its snapshot's ``size_bytes``).
    used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)

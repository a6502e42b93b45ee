"""The table of per-sandbox metric samples (issue #35), on the control plane's declarative ``Base``.

One row per sandbox, resolution and instant: ``bucket_s`` 0 is a raw sample as the metrics worker
pulled it from the sandbox's host (kept ``RAW_RETENTION_S``), ``bucket_s`` 60 a one-minute rollup of the
raw samples of that minute (kept ``ROLLUP_RETENTION_S``): CPU, memory and disk used averaged, limits and
the cumulative network counters at their last value, ``samples`` the number of raw samples it covers.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base

RAW = 0
MINUTE = 60
#: Raw samples are kept an hour, one-minute rollups a day; older rows are deleted by the worker.
RAW_RETENTION_S = 3600
ROLLUP_RETENTION_S = 86400


class SandboxMetricSample(Base):
    __tablename__ = "sandbox_metric_samples"
    __table_args__ = (
        Index("ix_sandbox_metric_samples_user", "user_id", "bucket_s", "at"),
        Index("ix_sandbox_metric_samples_age", "bucket_s", "at"),
    )

    sandbox_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    bucket_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(String(40))
    samples: Mapped[int] = mapped_column(Integer)
    vcpu: Mapped[int] = mapped_column(Integer)
    cpu_pct: Mapped[float] = mapped_column(Float)
    mem_used_bytes: Mapped[int] = mapped_column(BigInteger)
    mem_limit_bytes: Mapped[int] = mapped_column(BigInteger)
    disk_used_bytes: Mapped[int] = mapped_column(BigInteger)
    disk_limit_bytes: Mapped[int] = mapped_column(BigInteger)
    net_rx_bytes: Mapped[int] = mapped_column(BigInteger)
    net_tx_bytes: Mapped[int] = mapped_column(BigInteger)

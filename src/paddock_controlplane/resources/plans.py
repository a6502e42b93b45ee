"""Plans and their limits, exactly as the seed's plan table (§14.1). Stored as rows; this is the seed data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlanLimits:
    id: str
    name: str
    concurrent_sandboxes: int
    sandboxes_per_day: int
    networks_concurrent: int
    networks_per_day: int
    disks_concurrent: int
    disks_per_day: int
    templates_concurrent: int
    templates_per_day: int
    max_disk_mib: int
    max_vcpu: int
    max_mem_mib: int
    #: ``None`` means unlimited.
    webhook_endpoints: int | None


SEED_PLANS: tuple[PlanLimits, ...] = (
    PlanLimits("free", "Free", 1, 10, 1, 10, 0, 0, 0, 0, 10240, 1, 1024, 2),
    PlanLimits("beginner", "Beginner", 5, 50, 5, 50, 5, 50, 5, 50, 30720, 4, 4096, 4),
    PlanLimits("pro", "Pro", 20, 200, 20, 200, 20, 200, 20, 200, 51200, 8, 8192, 6),
    PlanLimits("enterprise", "Enterprise", 30, 300, 30, 300, 30, 300, 30, 300, 61440, 8, 16384, None),
)

PLAN_IDS = tuple(plan.id for plan in SEED_PLANS)

#: Snapshots an account may keep at once, by plan (issue #34; kept here, not in the plan rows, until the
#: plans table grows a column). A plan not listed keeps as many as it may keep templates.
SNAPSHOTS_CONCURRENT: dict[str, int] = {"free": 1, "beginner": 10, "pro": 50, "enterprise": 100}


def snapshots_concurrent(plan_id: str, templates_concurrent: int) -> int:
    return SNAPSHOTS_CONCURRENT.get(plan_id, templates_concurrent)


#: Local volumes an account may keep at once, by plan (issue #34; kept here, as snapshots' cap is, until
#: the plans table grows a column). A plan not listed keeps as many as it may keep S3 disks. Each
#: volume's size is bounded by the plan's ``max_disk_mib``.
VOLUMES_CONCURRENT: dict[str, int] = {"free": 1, "beginner": 5, "pro": 20, "enterprise": 30}


def volumes_concurrent(plan_id: str, disks_concurrent: int) -> int:
    return VOLUMES_CONCURRENT.get(plan_id, disks_concurrent)

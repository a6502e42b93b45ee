"""The shape and root-image catalogs (§10.2, §10.3).

The root images and their descriptions come from ``paddock_core.rootfs``, the list the host agent's
image builder installs from, so a description names only what the image holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paddock_core.rootfs import ROOT_IMAGES


@dataclass(frozen=True)
class Shape:
    id: str
    vcpu: int
    mem_mib: int
    cpu_quota_pct: int | None = None
    default_disk_mib: int = 10240

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "vcpu": self.vcpu,
            "mem_mib": self.mem_mib,
            "default_disk_mib": self.default_disk_mib,
        }
        if self.cpu_quota_pct is not None:
            out["cpu_quota_pct"] = self.cpu_quota_pct
        return out


SHAPES: tuple[Shape, ...] = (
    Shape("s-0.25vcpu-512mb", 1, 512, 25),
    Shape("s-0.5vcpu-1gb", 1, 1024, 50),
    Shape("s-1vcpu-256mb", 1, 256),
    Shape("s-1vcpu-1gb", 1, 1024),
    Shape("s-1vcpu-2gb", 1, 2048),
    Shape("s-2vcpu-2gb", 2, 2048),
    Shape("s-2vcpu-4gb", 2, 4096),
    Shape("s-4vcpu-4gb", 4, 4096),
    Shape("s-4vcpu-8gb", 4, 8192),
    Shape("s-8vcpu-8gb", 8, 8192),
    Shape("s-8vcpu-16gb", 8, 16384),
)
SHAPES_BY_ID = {shape.id: shape for shape in SHAPES}


SEED_DEFAULT_ROOTFS = "alpine:3.20"


def rootfs_view(available: set[str], configured_default: str) -> dict[str, Any]:
    """Only images that some active host has cached or can build are offered."""
    names = [image.name for image in ROOT_IMAGES if image.name in available]
    default = SEED_DEFAULT_ROOTFS if SEED_DEFAULT_ROOTFS in available else configured_default
    out: dict[str, Any] = {"rootfs": names, "default": default}
    if names:
        out["entries"] = [
            {"name": image.name, "description": image.description}
            for image in ROOT_IMAGES
            if image.name in available
        ]
    return out

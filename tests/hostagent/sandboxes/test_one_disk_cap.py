"""The disk overcommit is on the sum of the promises: one disk is never admitted larger than the host
could hold of it (real free space less the reserve, plus what a resized disk already holds), whatever
the ratio. The live check is tests/security/test_sandbox_isolation.py::test_disk_beyond_host_free_space_is_refused."""

from __future__ import annotations

import pytest

from paddock_hostagent.capacity import MIB, DiskView, Promise, Promised
from paddock_hostagent.errors import InsufficientCapacity


def test_one_disk_larger_than_the_host_can_hold_is_refused_whatever_the_overcommit() -> None:
    view = DiskView(70_000, 4096, Promised.of([Promise(10240, 3 * MIB) for _ in range(3)]), overcommit=20)
    assert view.free_mib > 80_000  # the sum of promises alone would admit it
    with pytest.raises(InsufficientCapacity) as refused:
        view.admit(80_000)
    assert str(refused.value) == (
        "80000 MiB requested, 65904 MiB free (disk: one disk may be at most 65904 MiB whatever the "
        "overcommit: the host's filesystem has 70000 MiB free, 4096 MiB of it kept for the host)"
    )
    view.admit(65_904)  # the largest disk the host can hold is still given


def test_a_resize_may_grow_a_disk_to_what_it_holds_plus_the_room_left() -> None:
    view = DiskView(10_000, 1000, Promised.of([Promise(10240, 2000 * MIB)]), overcommit=20)
    # The disk holds 2000 MiB and 9000 MiB more fit: it may grow to 11000 MiB, not beyond.
    view.admit(11_000 - 10240, disk_mib=11_000, holds_mib=2000)
    with pytest.raises(InsufficientCapacity) as refused:
        view.admit(12_000 - 10240, disk_mib=12_000, holds_mib=2000)
    assert str(refused.value).startswith(
        "1760 MiB requested, 760 MiB free (disk: one disk may be at most 11000 MiB whatever the overcommit: "
        "the host's filesystem has 10000 MiB free besides the 2000 MiB this disk holds"
    )


def test_at_ratio_one_the_sum_refuses_first_and_says_so() -> None:
    view = DiskView(70_000, 4096, Promised.of([Promise(10240, 3 * MIB)]))
    with pytest.raises(InsufficientCapacity) as refused:
        view.admit(80_000)
    assert "promised to 1 sandbox disks" in str(refused.value)

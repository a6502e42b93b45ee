"""Which of Paddock's shapes an E2B build's ``cpuCount`` and ``memoryMB`` boot (templates.shape_for).
The live test (tests/e2b/test_api_templates.py) builds a sized template with the unmodified SDK and
boots it."""

from __future__ import annotations

import pytest

from paddock_controlplane.edge.e2b.templates import shape_for
from paddock_core import errors


@pytest.mark.parametrize(
    ("cpus", "memory", "shape"),
    [
        (None, None, None),  # neither asked: the E2B API's shape
        (4, 4096, "s-4vcpu-4gb"),  # an exact shape
        (3, 1024, "s-4vcpu-4gb"),  # rounded up to whole shapes, CPUs first
        (2, 512, "s-2vcpu-2gb"),
        (1, 2048, "s-1vcpu-2gb"),
        (1, 128, "s-1vcpu-256mb"),  # never a fractional-CPU shape
        (None, 8192, "s-4vcpu-8gb"),  # the missing one is E2B's default (2 CPUs)
        (8, None, "s-8vcpu-8gb"),  # ... or 1024 MB
        (8, 16384, "s-8vcpu-16gb"),
    ],
)
def test_the_smallest_whole_cpu_shape_that_holds_both(
    cpus: int | None, memory: int | None, shape: str | None
) -> None:
    assert shape_for(cpus, memory) == shape


@pytest.mark.parametrize(
    ("cpus", "memory", "field"),
    [(0, 1024, "cpuCount"), (9, 1024, "cpuCount"), (2, 64, "memoryMB"), (2, 16385, "memoryMB")],
)
def test_sizes_past_paddocks_shapes_are_a_400_naming_the_field(cpus: int, memory: int, field: str) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        shape_for(cpus, memory)
    assert field in refused.value.fields

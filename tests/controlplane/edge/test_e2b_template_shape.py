"""Which of Paddock's shapes an E2B build's ``cpuCount`` and ``memoryMB`` boot (templates.shape_for).
The live test (tests/e2b/test_api_templates.py) builds a sized template with the unmodified SDK and
boots it."""

from __future__ import annotations

import pytest

from paddock_controlplane.edge.e2b.templates import cpus_for, shape_for
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


@pytest.mark.parametrize(
    ("shape", "most", "asked", "booted"),
    [
        ("s-2vcpu-2gb", None, None, "s-2vcpu-2gb"),  # nothing asked: the template's own
        ("s-2vcpu-2gb", None, 2, "s-2vcpu-2gb"),  # a fixed-size template's own number
        ("s-1vcpu-1gb", 4, 4, "s-4vcpu-4gb"),  # resizable: up to its maximum, the memory at least its own
        ("s-1vcpu-1gb", 4, 3, "s-4vcpu-4gb"),  # rounded up to whole shapes, as a build's sizes are
        ("s-4vcpu-8gb", 8, 1, "s-4vcpu-8gb"),  # fewer CPUs, but no shape of 1 CPU holds its 8 GiB
        ("s-2vcpu-4gb", 8, 8, "s-8vcpu-8gb"),
    ],
)
def test_a_create_boots_the_cpus_it_asks_within_the_templates_bounds(
    shape: str, most: int | None, asked: int | None, booted: str
) -> None:
    assert cpus_for(shape, most, asked) == booted


@pytest.mark.parametrize(
    ("shape", "most", "asked", "says"),
    [
        ("s-2vcpu-2gb", None, 4, "not resizable"),
        ("s-2vcpu-2gb", None, 1, "not resizable"),
        ("s-1vcpu-1gb", 4, 5, "maxCpuCount (4)"),
        ("s-1vcpu-1gb", 4, 0, "between 1"),
        ("s-1vcpu-1gb", 4, -2, "between 1"),
    ],
)
def test_cpus_past_the_template_are_a_400_naming_cpu_count(
    shape: str, most: int | None, asked: int, says: str
) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        cpus_for(shape, most, asked)
    assert "cpuCount" in refused.value.fields and says in str(refused.value)

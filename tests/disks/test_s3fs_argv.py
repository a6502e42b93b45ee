"""s3fs's command line is built from parsed fields only (the unit seam beside the live mounts of
test_hostagent_disks.py and the probes of tests/security/test_s3_probes.py): a record written before
these rules, holding a comma in its endpoint, is refused when the agent restores it, and a good one
gives exactly one ``url=`` and no option its fields did not ask for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from paddock_hostagent.drivers.storage.s3mounts import S3Mount, S3Mounter


def mount(**overrides: object) -> S3Mount:
    values: dict[str, object] = {
        "disk_id": "disk_x",
        "mount_path": "/data",
        "sub_path": "team/a",
        "bucket": "bucket-1",
        "endpoint": "HTTPS://S3.Example.COM:443/",
        "region": "eu-west-1",
        "use_path_style": True,
        "status": "mounted",
    }
    values.update(overrides)
    return S3Mount(**values)  # type: ignore[arg-type]


def test_the_command_line_holds_the_parsed_fields_and_nothing_else(tmp_path: Path) -> None:
    mounter = S3Mounter(tmp_path, resolv_conf="nameserver 10.0.0.1\n", binary="/usr/bin/s3fs")
    argv = mounter._s3fs_argv("sb-1", mount())
    options = [argv[i + 1] for i, item in enumerate(argv) if item == "-o"]
    assert argv[:4] == ["/usr/bin/s3fs", "bucket-1:/team/a", str(mounter._mount_point("sb-1", mount())), "-f"]
    assert [o for o in options if o.startswith(("url=", "endpoint=", "use_cache", "passwd_file="))] == [
        "url=https://s3.example.com:443",
        f"passwd_file={tmp_path}/sb-1/{mount().key}.passwd",
        "endpoint=eu-west-1",
    ]
    assert not any("," in option for option in options)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("endpoint", "https://8.8.8.8/,url=http://127.0.0.1:9"),
        ("endpoint", "http://8.8.8.8,use_cache=/root"),
        ("bucket", "b,use_cache=/root"),
        ("region", "us-east-1,url=http://127.0.0.1"),
        ("sub_path", "../other"),
        ("mount_path", "/proc"),
    ],
)
def test_a_recorded_mount_with_a_bad_field_is_refused_not_started(
    tmp_path: Path, field: str, value: str
) -> None:
    mounter = S3Mounter(tmp_path, resolv_conf="nameserver 10.0.0.1\n", binary="/usr/bin/false")
    with pytest.raises(ValueError, match=field):
        mounter._s3fs_argv("sb-1", mount(**{field: value}))
    # A restore (after an agent restart) of such a record ends in error, and starts nothing.
    recorded = mount(**{field: value})
    (tmp_path / "sb-1").mkdir()
    (tmp_path / "sb-1" / f"{recorded.key}.passwd").write_text("a:s\n")
    asyncio.run(mounter.restore("sb-1", recorded, ns_pid=1, netns="none"))
    assert recorded.status == "error" and "disk refused" in (recorded.error or ""), recorded
    assert not (tmp_path / "sb-1" / recorded.key).exists()

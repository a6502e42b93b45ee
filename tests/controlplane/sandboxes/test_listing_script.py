"""The listing that ``files.list``, E2B's ``ListDir`` and a polled watch run in a sandbox
(``sandbox_fs.LIST``), run here by the host's own ``sh`` and ``find`` on a tree of its own: it names
owners and groups as ``find``'s ``%u`` and ``%g`` name them from the same account tables, and a
listing cut at its byte limit holds only whole entries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from paddock_controlplane.sandboxes import sandbox_fs

pytestmark = pytest.mark.root  # chown to ids of no account

#: An id no line of the host's tables names: ``find`` prints the number.
UNNAMED = 4_123_456


def run_list(directory: Path, depth: int, limit_bytes: int = sandbox_fs.MAX_LIST_BYTES) -> bytes:
    argv = ["sh", "-c", sandbox_fs.LIST, "sh", *sandbox_fs.list_args(str(directory), depth, limit_bytes)]
    done = subprocess.run(argv, capture_output=True, check=True, timeout=60)
    return done.stdout


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "top"
    (top / "sub" / "deeper").mkdir(parents=True)
    for index in range(40):
        (top / "sub" / f"file-{index:02d}.txt").write_text("x" * index)
    (top / "sub" / "deeper" / "leaf").write_text("leaf")
    (top / "link").symlink_to("sub/deeper/leaf")
    os.chown(top / "sub" / "file-01.txt", 65534, 65534)  # nobody, nogroup
    os.chown(top / "sub" / "file-02.txt", UNNAMED, UNNAMED)
    os.chown(top / "sub" / "file-03.txt", 0, UNNAMED)
    os.chown(top / "link", 65534, 0, follow_symlinks=False)
    return top


def test_owners_and_groups_are_named_as_find_names_them(tree: Path) -> None:
    listed = sandbox_fs.listing(run_list(tree, 8))
    found = subprocess.run(
        ["find", str(tree), "-mindepth", "1", "-printf", r"%p\0%u\0%g\0%s\0"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")[:-1]
    expected = {
        found[i].decode(): (found[i + 1].decode(), found[i + 2].decode(), found[i + 3].decode())
        for i in range(0, len(found), 4)
    }
    assert len(expected) == 44
    assert {e["path"]: (e["owner"], e["group"], e["size"]) for e in listed} == expected
    by_path = {e["path"]: e for e in listed}
    assert (by_path[f"{tree}/sub/file-02.txt"]["owner"], by_path[f"{tree}/sub/file-02.txt"]["group"]) == (
        str(UNNAMED),
        str(UNNAMED),
    )
    assert by_path[f"{tree}/sub/file-01.txt"]["owner"] == "nobody"
    assert by_path[f"{tree}/link"]["symlinkTarget"] == "sub/deeper/leaf"


def test_a_listing_cut_at_its_limit_holds_only_whole_entries(tree: Path) -> None:
    whole = [e["path"] for e in sandbox_fs.listing(run_list(tree, 8))]
    records = len(run_list(tree, 8)) - len(run_list(tree, 8, 0))
    for limit in range(1, records, 13):
        cut = [e["path"] for e in sandbox_fs.listing(run_list(tree, 8, limit))]
        assert cut == whole[: len(cut)], (limit, cut[-1:])
        assert len(cut) < len(whole)


def test_the_account_tables_are_read_as_find_reads_them() -> None:
    hostile = "digits:x:²:0::/:/bin/sh\nlong:x:" + "9" * 5000 + ":0::/:/bin/sh\n"  # what int() refuses
    passwd = (
        hostile.encode()
        + b"root:x:0:0::/root:/bin/sh\nagent:x:4242:4242::/:/bin/sh\nagain:x:4242:1::/:/bin/sh\nbad line\n"
    )
    group = b"root:x:0:\nteam:x:4242:\n:x:7:\nodd:x:notanumber:\n"
    record = b"f\x002\x00644\x00-rw-r--r--\x004242\x004242\x001.5\x00\x00/a\x00"
    unnamed = b"f\x002\x00644\x00-rw-r--r--\x007\x009\x001.5\x00\x00/b\x00"
    [a, b] = sandbox_fs.listing(passwd + b"\0" + group + b"\0" + record + unnamed)
    assert (a["owner"], a["group"]) == ("agent", "team")  # the first line with the id, as getpwuid
    assert (b["owner"], b["group"]) == ("7", "9")
    assert sandbox_fs.listing(b"\0\0" + record)[0]["owner"] == "4242"  # no tables: numbers

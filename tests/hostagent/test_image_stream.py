"""A template's image streamed to another host (``image_transfer.stream``) while other builds on this
host link and unlink trees over the same base: the template's files are hard links to the base's, so
their link counts and ctimes move under ``tar``, which then exits 1 ("file changed as we read it")
though every byte it sent was right. The stream must end whole all the same."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import threading
from pathlib import Path

from paddock_hostagent import image_transfer
from paddock_hostagent.images import ImageStore

FILES = 2000


def test_an_image_streams_whole_while_its_base_files_gain_and_lose_links(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    for index in range(FILES):
        (base / f"f{index}").write_bytes(b"%d\n" % index)
    root = tmp_path / "images" / "tpl_churn"
    (root / "rootfs").mkdir(parents=True)
    for index in range(FILES):  # as the export links a template's tree to its base's
        os.link(base / f"f{index}", root / "rootfs" / f"f{index}")
    (root / "image.json").write_text(json.dumps({"name": "tpl_churn"}))
    images = ImageStore(tmp_path / "images")
    stop = threading.Event()
    churned = [0]

    def churn() -> None:  # another build linking a tree over the same base, and removing it
        while not stop.is_set():
            for index in range(0, FILES, 3):
                other = tmp_path / f"other{index}"
                os.link(base / f"f{index}", other)
                other.unlink()
            churned[0] += 1

    async def fetch() -> bytes:
        return b"".join([chunk async for chunk in await image_transfer.stream(images, "tpl_churn")])

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        sent = [asyncio.run(fetch()) for _ in range(10)]
    finally:
        stop.set()
        thread.join()
    assert churned[0] > 0
    for data in sent:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            names = archive.getnames()
            assert len([n for n in names if n.startswith("rootfs/f")]) == FILES
            member = archive.extractfile("rootfs/f1234")
            assert member is not None and member.read() == b"1234\n"

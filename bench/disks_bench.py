"""What S3 disks cost: sequential write and read through the s3fs mount, against the S3 server's own API
(boto3) in the same run, and the time from attach to ``mounted``.

    .venv/bin/python -m bench.disks_bench [--size-mib 100] [--rounds 3]

One ``tests.live`` platform (control plane + one host agent) and one moto S3 server in a network namespace
of its own (``tests/disks/s3server.py``: s3fs connects from the sandbox's network, as the sandbox would), both
started here. Each round, through the public API:

- write: a sandbox copies ``size`` MiB of random bytes from its own disk into the mounted bucket
  (``cp``, timed inside the sandbox; s3fs uploads on close, so the time includes the upload);
- read: a second sandbox, with its own mount (so no page cache is shared with the writer), reads the
  file back to /dev/null;
- floor: boto3 ``upload_file``/``download_fileobj`` of the same bytes from the host to the same server;
- attach→mounted: ``POST /v1/sandboxes/{id}/disks`` until ``GET …/disks`` shows ``mounted``.

Needs root, s3fs and the debian:13 image. Never fails on a time.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tests.disks.s3server import S3Server
from tests.live import LivePlatform, start_platform

from bench.stats import summarize
from paddock_hostagent.guest.build import ensure_agent_binary

SHAPE = "s-2vcpu-2gb"


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


def _sh(http: httpx.Client, sandbox_id: str, script: str) -> str:
    result = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}))
    out = result["result"]
    assert out["exit_code"] == 0, out
    return str(out["stdout"])


def _attach(http: httpx.Client, sandbox_id: str, disk: str, path: str) -> float:
    """Milliseconds from the attach request to ``mounted`` (polled every 10 ms)."""
    started = time.perf_counter()
    _ok(http.post(f"/v1/sandboxes/{sandbox_id}/disks", json={"disk_id": disk, "mount_path": path}))
    deadline = time.monotonic() + 60
    while True:  # ends: mounted, or the assertion
        items = _ok(http.get(f"/v1/sandboxes/{sandbox_id}/disks"))["data"]
        status = next(item["mount_status"] for item in items if item["mount_path"] == path)
        if status != "pending":
            assert status == "mounted", items
            return (time.perf_counter() - started) * 1000
        assert time.monotonic() < deadline, "mount still pending after 60 s"
        time.sleep(0.01)


def _detach(http: httpx.Client, sandbox_id: str, disk_id: str, path: str) -> None:
    _ok(http.delete(f"/v1/sandboxes/{sandbox_id}/disks/{disk_id}", params={"mount_path": path}))


def run(size_mib: int, rounds: int) -> dict[str, list[float]]:
    guest = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    data = Path(tempfile.mkdtemp(prefix="pdkbench-data-"))
    server: S3Server | None = None
    platform: LivePlatform | None = None
    out: dict[str, list[float]] = {"write": [], "read": [], "boto3_write": [], "boto3_read": [], "attach": []}
    try:
        ensure_agent_binary(guest)
        server = S3Server.start()
        platform = start_platform(guest, cp_env={"PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS": "true"})
        bucket = server.bucket("bench-" + secrets.token_hex(4))
        s3 = server.s3()
        with platform.http(platform.api_key()) as http:
            disk = _ok(
                http.post(
                    "/v1/disks",
                    json={
                        "name": "bench",
                        "kind": "s3",
                        "config": {"bucket": bucket, "endpoint": server.endpoint, "use_path_style": True},
                        "credentials": {"access_key": server.access_key, "secret_key": server.secret_key},
                    },
                )
            )
            body = {"shape": SHAPE, "disk_mib": 4096}
            writer = _ok(http.post("/v1/sandboxes", json=body))["id"]
            reader = _ok(http.post("/v1/sandboxes", json=body))["id"]
            _sh(http, writer, f"head -c {size_mib}M /dev/urandom > /root/src.bin")
            local = data / "src.bin"
            local.write_bytes(os.urandom(size_mib << 20))
            for index in range(rounds):
                out["attach"].append(_attach(http, writer, disk["id"], "/mnt/w"))
                out["attach"].append(_attach(http, reader, disk["id"], "/mnt/r"))
                key = f"round-{index}.bin"
                ns = _sh(
                    http,
                    writer,
                    f"s=$(date +%s%N); cp /root/src.bin /mnt/w/{key}; e=$(date +%s%N); echo $((e-s))",
                )
                out["write"].append(int(ns) / 1e6)
                ns = _sh(
                    http,
                    reader,
                    f"s=$(date +%s%N); cat /mnt/r/{key} > /dev/null; e=$(date +%s%N); echo $((e-s))",
                )
                out["read"].append(int(ns) / 1e6)
                _detach(http, writer, disk["id"], "/mnt/w")
                _detach(http, reader, disk["id"], "/mnt/r")
                started = time.perf_counter()
                s3.upload_file(str(local), bucket, f"boto3-{key}")
                out["boto3_write"].append((time.perf_counter() - started) * 1000)
                sink = io.BytesIO()
                started = time.perf_counter()
                s3.download_fileobj(bucket, f"boto3-{key}", sink)
                out["boto3_read"].append((time.perf_counter() - started) * 1000)
                assert sink.tell() == size_mib << 20
            for sandbox_id in (writer, reader):
                http.delete(f"/v1/sandboxes/{sandbox_id}")
    finally:
        try:
            if platform is not None:
                platform.stop()
        finally:
            try:
                if server is not None:
                    server.stop()
            finally:
                shutil.rmtree(guest, ignore_errors=True)
                shutil.rmtree(data, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = run(args.size_mib, args.rounds)
    print(f"{'operation':34s} {'p50':>9s} {'min':>9s} {'max':>9s} {'unit':>5s} {'n':>3s}")

    def row(label: str, values: list[float], unit: str) -> None:
        stats = summarize(values)
        print(
            f"{label:34s} {stats['p50']:9.1f} {stats['min']:9.1f} {stats['max']:9.1f} {unit:>5s} {stats['n']:3d}"
        )

    def mb_per_s(values: list[float]) -> list[float]:
        return [args.size_mib * 1.048576 / (ms / 1000) for ms in values]

    row(f"write {args.size_mib} MiB via mount (cp)", mb_per_s(results["write"]), "MB/s")
    row(f"floor: boto3 upload {args.size_mib} MiB", mb_per_s(results["boto3_write"]), "MB/s")
    row(f"read {args.size_mib} MiB via mount (cat)", mb_per_s(results["read"]), "MB/s")
    row(f"floor: boto3 download {args.size_mib} MiB", mb_per_s(results["boto3_read"]), "MB/s")
    row("attach -> mounted (API)", results["attach"], "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

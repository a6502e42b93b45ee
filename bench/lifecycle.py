"""Sandbox lifecycle latency: Paddock through its public API, the raw OCI runtime floor, podman as a peer.

Every system runs the same round, on the same machine and the same image (debian:13 from the image
cache): create → running, ``true`` round trips, the first frame of a streamed ``echo``, a 1 MB and a
100 MB file (smoke: 8 MB) written then read back (compared byte for byte), pause, resume, fork of the
sandbox (which by then holds the big file) and destroy of both. The first ``warmup`` rounds are not recorded.

- paddock: the SDK's ``Client`` against a real control plane + host agent (``tests.live``). Before each
  create and fork the host's warm pool is allowed to refill, untimed, as it would between requests on a
  live host; the rest is measured after the refill has finished too.
- host agent alone: the same round on the host agent's internal API (what the control plane calls), so
  Paddock's column minus this one is the control plane's share.
- floor (raw runc / crun): an overlay mount of the image (upper dir on the root filesystem) + ``run -d``
  of ``sleep infinity``; ``exec``; files through ``exec sh -c 'cat > F'`` and ``exec cat F``; ``pause``;
  ``resume``; fork = pause, copy the upper dir, resume, mount and ``run -d`` the copy; ``delete -f`` +
  unmount + remove. No network namespace setup beyond the runtime's empty one, no guest agent, no API.
- peer (podman 4 ``run --rootfs IMAGE:O``, ``--network none``): the same round; podman has no live
  fork without CRIU, so that row stays empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.stats import Samples
from paddock._blocking import BytesBody

EXECS_PER_ROUND = 10  # after the first command of a new sandbox, which is its own row
SHAPE = "s-1vcpu-256mb"
SHAPE_MIB = 256
DISK_MIB = 2048  # the bench agent's warm-pool disk size: creates of this size take a warm slot
#: The same sandbox as ``SHAPE`` asked of the host agent's internal API (what the control plane sends).
AGENT_SPEC = {
    "rootfs": "debian:13",
    "vcpu": 1,
    "mem_mib": SHAPE_MIB,
    "cpu_quota_pct": None,
    "disk_mib": DISK_MIB,
}
SMALL = os.urandom(1 << 20)
BIG_MIB = 100
BIG = os.urandom(BIG_MIB << 20)
BIG_OP, BIG_PATH = "file_big", "/root/bench-big"


def use_big_file(mib: int) -> None:
    """The size of the big file (100 MB; the smoke run uses a smaller one to stay quick)."""
    global BIG, BIG_MIB
    if mib != BIG_MIB:
        BIG_MIB, BIG = mib, os.urandom(mib << 20)


class BenchError(RuntimeError):
    """A round could not complete: the harness records it and the run fails."""


def rounds(samples: Samples, warmup: int, runs: int, one_round: Callable[[int], None]) -> None:
    for index in range(warmup + runs):
        samples.recording = index >= warmup
        one_round(index)
    samples.recording = True


# -- Paddock through its public API ---------------------------------------------------------------


class PaddockLifecycle:
    def __init__(self, base_url: str, api_key: str, agent_url: str, agent_token: str, pool_size: int) -> None:
        from paddock import Client, RetryPolicy

        self.client = Client(base_url, api_key, timeout=300, retry=RetryPolicy(max_retries=0))
        self.agent = httpx.Client(
            base_url=agent_url, headers={"Authorization": f"Bearer {agent_token}"}, timeout=30
        )
        self.pool_size = pool_size
        self.samples = Samples()

    def wait_pool(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.agent.get("/internal/v1/info").json().get("warm_slots", 0) >= self.pool_size:
                return
            time.sleep(0.05)

    def running(self, sandbox: Any) -> Any:
        if sandbox.info.status != "running":
            sandbox.wait_until("running")
        return sandbox

    def files(self, sandbox: Any, label: str, path: str, data: bytes) -> None:
        with self.samples.time(label):
            with self.samples.time(label + "_write"):
                sandbox.write_file(path, data)
            with self.samples.time(label + "_read"):
                back = sandbox.read_file(path)
        if back != data:
            raise BenchError(
                f"paddock: {path} read back {len(back)} bytes that differ from the {len(data)} written"
            )

    def round(self, index: int) -> None:
        s = self.samples
        self.wait_pool()
        with s.time("create"):
            sandbox = self.running(
                self.client.sandboxes.create(
                    SHAPE, name=f"bench-{index}", rootfs="debian:13", disk_mib=DISK_MIB
                )
            )
        child = None
        try:
            self.wait_pool()
            for call in range(1 + EXECS_PER_ROUND):
                with s.time("first_exec" if call == 0 else "exec"):
                    result = sandbox.run("true")
                if result.exit_code != 0:
                    raise BenchError(f"paddock: `true` exited {result.exit_code}")
            started = time.perf_counter()
            frames = sandbox.stream("echo", ["ready"])
            first = next(frame for frame in frames if not frame.get("hb"))
            s.add("first_frame", (time.perf_counter() - started) * 1000)
            rest = list(frames)
            if first.get("stdout", "").strip() != "ready" or rest[-1:] != [{"exit_code": 0}]:
                raise BenchError(f"paddock: stream frames {[first, *rest]}")
            self.files(sandbox, "file_1mb", "/root/bench-1m", SMALL)
            self.files(sandbox, BIG_OP, BIG_PATH, BIG)
            with s.time("pause"):
                sandbox.pause()
            with s.time("resume"):
                sandbox.resume()
            self.wait_pool()
            with s.time("fork"):
                child = self.running(sandbox.fork())
            if child.run("stat", ["-c", "%s", BIG_PATH]).stdout.strip() != str(len(BIG)):
                raise BenchError("paddock: the fork does not hold the big file")
        finally:
            if child is not None:
                self.destroy(child)
            self.destroy(sandbox)

    def destroy(self, sandbox: Any) -> None:
        """The API answers ``destroying`` and reclaims in the background: time both the answer and the end."""
        from paddock import NotFoundError

        started = time.perf_counter()
        status = sandbox.destroy()
        self.samples.add("destroy_answer", (time.perf_counter() - started) * 1000)
        deadline = time.monotonic() + 120
        while status != "destroyed" and time.monotonic() < deadline:
            time.sleep(0.01)
            try:
                status = sandbox.refresh().status
            except NotFoundError:
                break
        if status != "destroyed":
            raise BenchError(f"paddock: {sandbox.id} is {status} two minutes after destroy")
        self.samples.add("destroy", (time.perf_counter() - started) * 1000)

    def close(self) -> None:
        self.client.close()
        self.agent.close()


# -- fork against what the source holds --------------------------------------------------------------

FORK_SIZES_MIB = (100, 2048)
FRESH_MIB = 100
#: Empty files created right before a fork (``fork_files_<n>``): a metadata-heavy source, whose XFS log
#: a clone's mount would replay unless the fork quiesces it (drivers/storage/rootdisks.py).
FRESH_FILES = 20_000


def fork_scale(
    base_url: str,
    api_key: str,
    agent_url: str,
    agent_token: str,
    pool_size: int,
    runs: int,
    sizes_mib: tuple[int, ...] = FORK_SIZES_MIB,
    fresh_mib: int = FRESH_MIB,
    fresh_files: int = FRESH_FILES,
) -> dict[str, Any]:
    """Fork → running through the API of a source that holds ``size`` MiB of random data, for each size:

    - ``fork_settled_<size>``: the data was written and synced (untimed) before the forks, as it is
      once the kernel has written it back (≤ 30 s after it was written);
    - ``fork_fresh_<fresh_mib>`` (on the first size's source): a new ``fresh_mib`` MiB file written right
      before each fork, still dirty in the page cache, so the fork pays its writeback to the host disk;
    - ``fork_files_<fresh_files>`` (same source): ``fresh_files`` empty files created in a new directory
      right before each fork, so the source's log holds their metadata.

    What differs between the sizes is only what the source holds: every source has the same disk size,
    each is forked once untimed first (a sync inside the sandbox stops at the image's page cache, since
    the loop device writes through it, so the first fork would pay the writeback the host has not done
    yet), and the timed forks alternate between the sources, so a change of load on a shared box does
    not pass for a difference of size. Each fork is checked to hold the source's data (size) and
    destroyed, untimed; the pool refills untimed before each fork, as in the lifecycle round."""
    driver = PaddockLifecycle(base_url, api_key, agent_url, agent_token, pool_size)
    disk_mib = max(DISK_MIB, max(sizes_mib) + 1024)
    sources: dict[int, Any] = {}
    try:
        for size in sizes_mib:
            driver.wait_pool()
            sandbox = driver.running(
                driver.client.sandboxes.create(
                    SHAPE, name=f"bench-hold-{size}", rootfs="debian:13", disk_mib=disk_mib
                )
            )
            sources[size] = sandbox
            fill = f"head -c {size}M /dev/urandom > /root/fill && sync"
            if sandbox.run("sh", ["-c", fill], timeout_s=600).exit_code != 0:
                raise BenchError(f"paddock: could not write {size} MiB into the source")
            _timed_fork(driver, sandbox, None, "/root/fill", size << 20)
        for _ in range(runs):
            for size in sizes_mib:
                _timed_fork(driver, sources[size], f"fork_settled_{size}", "/root/fill", size << 20)
        first = sources[sizes_mib[0]]
        for index in range(runs):
            fresh = f"head -c {fresh_mib}M /dev/urandom > /root/fresh-{index}"
            if first.run("sh", ["-c", fresh], timeout_s=600).exit_code != 0:
                raise BenchError("paddock: could not write the fresh file")
            _timed_fork(driver, first, f"fork_fresh_{fresh_mib}", f"/root/fresh-{index}", fresh_mib << 20)
            # 20 fresh files of 100 MiB would fill a 2 GiB disk (ENOSPC at the 19th).
            first.run("rm", ["-f", f"/root/fresh-{index}"])
        for index in range(runs):
            where = f"/root/files-{index}"
            touch = f"mkdir {where} && cd {where} && seq -f f%g {fresh_files} | xargs touch"
            if first.run("sh", ["-c", touch], timeout_s=600).exit_code != 0:
                raise BenchError("paddock: could not create the fresh files")
            _timed_fork(driver, first, f"fork_files_{fresh_files}", f"{where}/f{fresh_files}", 0)
        summary = driver.samples.summary()
        summary.pop("destroy", None)
        summary.pop("destroy_answer", None)
        return {
            "sizes_mib": list(sizes_mib),
            "fresh_mib": fresh_mib,
            "fresh_files": fresh_files,
            "disk_mib": disk_mib,
            **summary,
        }
    finally:
        for sandbox in sources.values():
            driver.destroy(sandbox)
        driver.close()


def _timed_fork(
    driver: PaddockLifecycle, sandbox: Any, label: str | None, path: str, size_bytes: int
) -> None:
    """One fork → running, recorded under ``label`` (``None``: untimed), checked and destroyed."""
    driver.wait_pool()
    started = time.perf_counter()
    child = driver.running(sandbox.fork())
    if label is not None:
        driver.samples.add(label, (time.perf_counter() - started) * 1000)
    try:
        held = child.run("stat", ["-c", "%s", path]).stdout.strip()
        if held != str(size_bytes):
            raise BenchError(f"paddock: the fork holds {held!r} bytes of {path}, not {size_bytes}")
    finally:
        driver.destroy(child)


# -- the host agent alone: the same round on its internal API, no control plane ----------------------


class HostAgentLifecycle:
    """What the control plane calls for each operation, called directly: the API's overhead is the rest."""

    def __init__(self, agent_url: str, agent_token: str, pool_size: int) -> None:
        self.http = httpx.Client(
            base_url=agent_url + "/internal/v1/",
            headers={"Authorization": f"Bearer {agent_token}"},
            timeout=httpx.Timeout(300, connect=5),
        )
        self.pool_size = pool_size
        self.samples = Samples()
        self.live: list[str] = []

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise BenchError(f"host agent {method} {path}: {response.status_code} {response.text[:300]}")
        return (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else response
        )

    def wait_pool(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.call("GET", "info").get("warm_slots", 0) < self.pool_size:
            time.sleep(0.05)

    def exec(self, sandbox_id: str, cmd: str, args: list[str]) -> dict[str, Any]:
        body = {"cmd": cmd, "args": args, "env": {}, "stream": False}
        return dict(self.call("POST", f"sandboxes/{sandbox_id}/exec", json=body))

    def files(self, sandbox_id: str, label: str, path: str, data: bytes) -> None:
        with self.samples.time(label):
            with self.samples.time(label + "_write"):
                # As the SDK sends it (slices under a Content-Length): httpx's sync transport handed one
                # 100 MB bytes object copies what is left after every send, which measured the client.
                self.call(
                    "PUT",
                    f"sandboxes/{sandbox_id}/files",
                    params={"path": path},
                    content=BytesBody(data),
                    headers={"Content-Length": str(len(data))},
                )
            with self.samples.time(label + "_read"):
                back = self.http.get(f"sandboxes/{sandbox_id}/files", params={"path": path}).content
        if back != data:
            raise BenchError(f"host agent: {path} read back differs")

    def round(self, index: int) -> None:
        s = self.samples
        parent, child = f"sb-bench-agent-{os.getpid()}-{index}", f"sb-bench-agent-{os.getpid()}-{index}-fork"
        spec = AGENT_SPEC
        self.wait_pool()
        try:
            with s.time("create"):
                self.live.append(parent)
                self.call("POST", "sandboxes", json={"id": parent, "name": f"agent-{index}", **spec})
            self.wait_pool()
            for call in range(1 + EXECS_PER_ROUND):
                with s.time("first_exec" if call == 0 else "exec"):
                    result = self.exec(parent, "true", [])
                if result["exit_code"] != 0:
                    raise BenchError(f"host agent: `true` exited {result['exit_code']}")
            started = time.perf_counter()
            body = {"cmd": "echo", "args": ["ready"], "env": {}, "stream": True}
            with self.http.stream("POST", f"sandboxes/{parent}/exec", json=body) as response:
                lines = (json.loads(line) for line in response.iter_lines() if line.strip())
                first = next(frame for frame in lines if not frame.get("hb"))
                s.add("first_frame", (time.perf_counter() - started) * 1000)
                list(lines)
            if first.get("stdout", "").strip() != "ready":
                raise BenchError(f"host agent: first frame {first}")
            self.files(parent, "file_1mb", "/root/bench-1m", SMALL)
            self.files(parent, BIG_OP, BIG_PATH, BIG)
            with s.time("pause"):
                self.call("POST", f"sandboxes/{parent}/pause")
            with s.time("resume"):
                self.call("POST", f"sandboxes/{parent}/resume")
            self.wait_pool()
            with s.time("fork"):
                self.live.append(child)
                fork = {"new_id": child, "name": "fork", "start_paused": False}
                self.call("POST", f"sandboxes/{parent}/fork", json=fork)
        finally:
            for victim in (child, parent):
                if victim in self.live:
                    with s.time("destroy"):
                        self.call("DELETE", f"sandboxes/{victim}")
                    self.live.remove(victim)

    def close(self) -> None:
        for victim in list(self.live):
            self.http.delete(f"sandboxes/{victim}")
        self.http.close()


# -- the floor: a raw OCI runtime with an overlay mount -----------------------------------------------


class RawRuntimeLifecycle:
    def __init__(self, runtime: str, rootfs: Path) -> None:
        binary = shutil.which(runtime)
        if binary is None:
            raise BenchError(f"{runtime} is not installed")
        self.runtime = runtime
        self.rootfs = rootfs
        self.work = Path(tempfile.mkdtemp(prefix=f"pdkbench-{runtime}-", dir="/var/tmp"))
        subprocess.run([binary, "spec", "--bundle", str(self.work)], check=True, capture_output=True)
        self.config = json.loads((self.work / "config.json").read_text())
        self.config["process"]["terminal"] = False
        self.config["process"]["args"] = ["sleep", "infinity"]
        self.state_root = f"/run/pdkbench-{os.getpid()}-{runtime}"
        self.base = [binary, "--root", self.state_root]
        if runtime == "crun":
            self.base.append("--cgroup-manager=cgroupfs")
        self.samples = Samples()
        self.live: list[str] = []

    def call(self, *argv: str, stdin: bytes | None = None) -> bytes:
        result = subprocess.run(
            [*self.base, *argv],
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
        )
        if result.returncode != 0:
            raise BenchError(
                f"{self.runtime} {' '.join(argv[:2])}: {result.stderr.decode(errors='replace')[-300:]}"
            )
        return result.stdout

    def start(self, name: str, upper_from: Path | None = None) -> None:
        box = self.work / name
        for part in ("work", "merged"):
            (box / part).mkdir(parents=True)
        if upper_from is None:
            (box / "upper").mkdir()
        else:
            subprocess.run(["cp", "-a", "--sparse=always", str(upper_from), str(box / "upper")], check=True)
        subprocess.run(
            [
                "mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={self.rootfs},upperdir={box / 'upper'},workdir={box / 'work'}",
                str(box / "merged"),
            ],
            check=True,
        )  # fmt: skip
        config = dict(self.config, root={"path": str(box / "merged"), "readonly": False})
        (box / "config.json").write_text(json.dumps(config))
        # run -d hands its stdio to the container: no pipes, or they never close
        result = subprocess.run(
            [*self.base, "run", "-d", "-b", str(box), name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.live.append(name)
        if result.returncode != 0:
            raise BenchError(f"{self.runtime} run -d {name} exited {result.returncode}")

    def stop(self, name: str) -> None:
        box = self.work / name
        subprocess.run([*self.base, "delete", "-f", name], capture_output=True)
        subprocess.run(["umount", str(box / "merged")], capture_output=True)
        shutil.rmtree(box, ignore_errors=True)
        if name in self.live:
            self.live.remove(name)

    def first_frame(self, name: str) -> None:
        started = time.perf_counter()
        proc = subprocess.Popen([*self.base, "exec", name, "echo", "ready"], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        first = proc.stdout.read(1)
        self.samples.add("first_frame", (time.perf_counter() - started) * 1000)
        rest = proc.stdout.read()
        proc.wait()
        if first + rest != b"ready\n":
            raise BenchError(f"{self.runtime}: echo printed {first + rest!r}")

    def files(self, name: str, label: str, path: str, data: bytes) -> None:
        with self.samples.time(label):
            with self.samples.time(label + "_write"):
                self.call("exec", name, "sh", "-c", f"cat > {path}", stdin=data)
            with self.samples.time(label + "_read"):
                back = self.call("exec", name, "cat", path)
        if back != data:
            raise BenchError(f"{self.runtime}: {path} read back differs")

    def round(self, index: int) -> None:
        s = self.samples
        name, child = f"pdkb-{os.getpid()}-{index}", f"pdkb-{os.getpid()}-{index}-fork"
        try:
            with s.time("create"):
                self.start(name)
            for call in range(1 + EXECS_PER_ROUND):
                with s.time("first_exec" if call == 0 else "exec"):
                    self.call("exec", name, "true")
            self.first_frame(name)
            self.files(name, "file_1mb", "/root/bench-1m", SMALL)
            self.files(name, BIG_OP, BIG_PATH, BIG)
            with s.time("pause"):
                self.call("pause", name)
            with s.time("resume"):
                self.call("resume", name)
            with s.time("fork"):
                self.call("pause", name)
                try:
                    self.start(child, upper_from=self.work / name / "upper")
                finally:
                    self.call("resume", name)
        finally:
            for victim in (child, name):
                if victim in self.live:
                    with s.time("destroy"):
                        self.stop(victim)

    def close(self) -> None:
        for name in list(self.live):
            self.stop(name)
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.state_root, ignore_errors=True)  # the runtime's state dir, empty by now


# -- the peer: podman --rootfs ---------------------------------------------------------------------------


class PodmanLifecycle:
    FLAGS = ("--network", "none", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096")

    def __init__(self, rootfs: Path) -> None:
        if shutil.which("podman") is None:
            raise BenchError("podman is not installed (make bench-deps)")
        self.rootfs = rootfs
        self.samples = Samples()
        self.live: list[str] = []

    def call(self, *argv: str, stdin: bytes | None = None) -> bytes:
        result = subprocess.run(
            ["podman", *argv],
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
        )
        if result.returncode != 0:
            raise BenchError(f"podman {' '.join(argv[:2])}: {result.stderr.decode(errors='replace')[-300:]}")
        return result.stdout

    def round(self, index: int) -> None:
        s = self.samples
        name = f"pdkb-{os.getpid()}-{index}"
        try:
            with s.time("create"):
                self.live.append(name)
                self.call(
                    "run",
                    "-d",
                    "--name",
                    name,
                    *self.FLAGS,
                    "--rootfs",
                    f"{self.rootfs}:O",
                    "sleep",
                    "infinity",
                )
            for call in range(1 + EXECS_PER_ROUND):
                with s.time("first_exec" if call == 0 else "exec"):
                    self.call("exec", name, "true")
            started = time.perf_counter()
            proc = subprocess.Popen(["podman", "exec", name, "echo", "ready"], stdout=subprocess.PIPE)
            assert proc.stdout is not None
            first = proc.stdout.read(1)
            s.add("first_frame", (time.perf_counter() - started) * 1000)
            rest = proc.stdout.read()
            proc.wait()
            if first + rest != b"ready\n":
                raise BenchError(f"podman: echo printed {first + rest!r}")
            for label, path, data in (
                ("file_1mb", "/root/bench-1m", SMALL),
                (BIG_OP, BIG_PATH, BIG),
            ):
                with s.time(label):
                    with s.time(label + "_write"):
                        self.call("exec", "-i", name, "sh", "-c", f"cat > {path}", stdin=data)
                    with s.time(label + "_read"):
                        back = self.call("exec", name, "cat", path)
                if back != data:
                    raise BenchError(f"podman: {path} read back differs")
            with s.time("pause"):
                self.call("pause", name)
            with s.time("resume"):
                self.call("unpause", name)
        finally:
            if name in self.live:
                with s.time("destroy"):
                    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
                self.live.remove(name)

    def close(self) -> None:
        for name in list(self.live):
            subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)

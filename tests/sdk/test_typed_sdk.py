"""The SDK is typed for its users (issue 31): a misspelled keyword to ``create`` or ``fork`` is a
``TypeError`` before anything is sent, the package ships ``py.typed`` so a user's mypy reads its
annotations, reads return models (still readable as the dicts they were), and ``help(Client)`` names
the resources."""

from __future__ import annotations

import importlib.resources
import inspect
import json
import pydoc
import socket
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import paddock
from paddock_controlplane.records.schemas.sandboxes import CreateSandboxRequest, ForkSandboxRequest


@pytest.fixture
def unused_url() -> Iterator[str]:
    """A 127.0.0.1 port held bound but not listening: any request to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


def test_a_misspelled_keyword_to_create_or_fork_is_a_type_error_naming_it(unused_url: str) -> None:
    # a request would be a TransportError (nothing listens, and retries would wait): TypeError means
    # the call was refused before any request
    with paddock.Client(unused_url, "key", retry=paddock.RetryPolicy(max_retries=0)) as client:
        with pytest.raises(TypeError, match="envz"):
            client.sandboxes.create("s-1vcpu-1gb", envz={"A": "b"})  # type: ignore[call-arg]
        sandbox = paddock.Sandbox(client, paddock.SandboxInfo(id="sb-1", status="running"))
        with pytest.raises(TypeError, match="nmae"):
            sandbox.fork(nmae="copy")  # type: ignore[call-arg]
        # fork takes no ``name``: the child's is generated (§11.9); it had been sent and ignored
        with pytest.raises(TypeError, match="name"):
            sandbox.fork(name="copy")  # type: ignore[call-arg]
        with pytest.raises(paddock.TransportError):  # the same client does reach for the network
            client.sandboxes.create("s-1vcpu-1gb", envs={"A": "b"})


async def test_the_async_client_refuses_them_too(unused_url: str) -> None:
    async with paddock.AsyncClient(unused_url, "key", retry=paddock.RetryPolicy(max_retries=0)) as client:
        with pytest.raises(TypeError, match="envz"):
            await client.sandboxes.create("s-1vcpu-1gb", envz={"A": "b"})  # type: ignore[call-arg]
        sandbox = paddock.AsyncSandbox(client, paddock.SandboxInfo(id="sb-1", status="running"))
        with pytest.raises(TypeError, match="start_pasued"):
            await sandbox.fork(start_pasued=True)  # type: ignore[call-arg]


def keyword_names(function: Any) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_the_keywords_are_the_request_bodies_fields() -> None:
    """Each body field is a keyword of the same name, so a new field the SDK lacks shows up here."""
    for create in (paddock.Sandboxes.create, paddock.AsyncSandboxes.create):
        # bandwidth_quota_bytes may only be absent or 0 (§10.6); wait_timeout_s is the SDK's own wait
        assert keyword_names(create) == (
            set(CreateSandboxRequest.model_fields) - {"shape", "bandwidth_quota_bytes"}
        ) | {"wait_timeout_s"}
    for fork in (paddock.Sandbox.fork, paddock.AsyncSandbox.fork):
        # ``timeout_s`` is the wait, as on pause and resume (docs/limits.md), not the body's lifetime
        assert keyword_names(fork) == (
            set(ForkSandboxRequest.model_fields) - {"bandwidth_quota_bytes", "timeout_s", "on_timeout"}
        ) | {"wait", "timeout_s"}


def test_create_and_fork_send_the_keywords_under_the_wires_names() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, json.loads(request.content)))
        status = "paused" if sent[-1][1].get("start_paused") else "running"
        return httpx.Response(200, json={"status": "success", "data": {"id": "sb-2", "status": status}})

    with paddock.Client("http://127.0.0.1:9", "key", transport=httpx.MockTransport(answer)) as client:
        sandbox = client.sandboxes.create(
            "s-1vcpu-1gb",
            rootfs="debian:13",
            name="box",
            networks=[{"id": "net_1"}],
            disk_mib=2048,
            egress=("example.com",),
            envs={"A": "1"},
            ssh_pubkeys=["ssh-ed25519 AAAA"],
            node_selector={"zone": "a"},
            ingress_enabled=False,
            disks=[{"disk_id": "data", "mount_path": "/data"}],
            auto_pause_after_seconds=600,
            timeout_s=60,
            on_timeout="pause",
            on_idle="hibernate",
            metadata={"team": "docs"},
        )
        sandbox.fork(start_paused=True, envs={"B": "2"}, egress=[], metadata={"k": "v"})
        sandbox.fork()
    assert sent == [
        (
            "/v1/sandboxes",
            {
                "shape": "s-1vcpu-1gb",
                "rootfs": "debian:13",
                "name": "box",
                "networks": [{"id": "net_1"}],
                "disk_mib": 2048,
                "egress": ["example.com"],
                "envs": {"A": "1"},
                "ssh_pubkeys": ["ssh-ed25519 AAAA"],
                "node_selector": {"zone": "a"},
                "ingress_enabled": False,
                "disks": [{"disk_id": "data", "mount_path": "/data"}],
                "auto_pause_after_seconds": 600,
                "timeout_s": 60,
                "on_timeout": "pause",
                "on_idle": "hibernate",
                "metadata": {"team": "docs"},
            },
        ),
        (
            "/v1/sandboxes/sb-2/fork",
            {"start_paused": True, "envs": {"B": "2"}, "egress": [], "metadata": {"k": "v"}},
        ),
        ("/v1/sandboxes/sb-2/fork", {}),
    ]


def test_a_sandboxs_idle_hibernation_reads_as_a_field() -> None:
    info = paddock.SandboxInfo.from_api({"id": "sb-1", "status": "running", "on_idle": "hibernate"})
    assert info.on_idle == "hibernate" and "on_idle" not in info.extra


def test_py_typed_is_installed_in_the_package() -> None:
    assert (Path(paddock.__file__).parent / "py.typed").is_file()
    assert importlib.resources.files("paddock").joinpath("py.typed").is_file()


USER_SCRIPT = """\
import paddock


def main() -> int:
    with paddock.Client("http://127.0.0.1:8080", "key") as client:
        who = client.whoami()
        running: int = who.stats.running
        user: str = who.user_id
        sizes = [shape.mem_mib for shape in client.shapes()]
        default: str = client.rootfs().default
        with client.sandboxes.create(
            "s-1vcpu-1gb", rootfs=default, name=user, ENVS_KEYWORD={"MODE": "demo"}, timeout_s=600
        ) as sandbox:
            result = sandbox.run("echo", ["hi"])
            size: int = sandbox.files.write("/tmp/x", b"data")
            data: bytes = sandbox.files.read("/tmp/x")
            entries = [entry.name for entry in sandbox.files.list("/tmp")]
            child = sandbox.fork(envs={"MODE": "child"})
            child.destroy()
            return result.exit_code + running + size + len(data) + len(entries) + sum(sizes)
"""


def run_mypy(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "user.py").write_text(script)
    # run where no project config is: the user's own strict mypy against the installed package
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_users_strict_mypy_checks_calls_into_the_sdk(tmp_path: Path) -> None:
    good = run_mypy(tmp_path, USER_SCRIPT.replace("ENVS_KEYWORD", "envs"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Success: no issues found in 1 source file" in good.stdout

    misspelled = run_mypy(tmp_path, USER_SCRIPT.replace("ENVS_KEYWORD", "envz"))
    assert misspelled.returncode == 1, misspelled.stdout + misspelled.stderr
    assert 'Unexpected keyword argument "envz"' in misspelled.stdout, misspelled.stdout
    assert misspelled.stdout.count("error:") == 1, misspelled.stdout  # only that line is wrong


def test_help_on_the_client_names_its_resources() -> None:
    for client_class, prefix in ((paddock.Client, ""), (paddock.AsyncClient, "Async")):
        text = pydoc.render_doc(client_class)
        for resource in ("sandboxes", "templates", "disks", "networks", "webhooks"):
            assert f"``{resource}``" in text, resource
        hints = typing.get_type_hints(client_class)
        assert hints["sandboxes"] is getattr(paddock, f"{prefix}Sandboxes")
        assert hints["templates"].__name__ == f"{prefix}Templates"


def catalog_answer(request: httpx.Request) -> httpx.Response:
    data: Any = {
        "/v1/whoami": {
            "user_id": "usr_1",
            "stats": {"running": 1, "paused": 2, "other": 0, "total": 3},
            "credits": {"balance": 9.5, "spent": 0.5},
        },
        "/v1/shapes": {
            "data": [
                {
                    "id": "s-0.5vcpu-1gb",
                    "vcpu": 1,
                    "mem_mib": 1024,
                    "default_disk_mib": 10240,
                    "cpu_quota_pct": 50,
                }
            ],
            "pagination": {"total": 1},
        },
        "/v1/rootfs": {
            "rootfs": ["debian:13"],
            "default": "debian:13",
            "entries": [{"name": "debian:13", "description": "Minimal"}],
        },
        "/v1/hosts": {
            "data": [{"id": "h1", "status": "active", "free_mib": 512, "vm_count": 2, "rack": "r1"}],
            "pagination": {"total": 1},
        },
    }[request.url.path]
    return httpx.Response(200, json={"status": "success", "data": data})


def test_the_account_and_catalog_reads_are_models_that_still_read_as_dicts() -> None:
    with paddock.Client("http://127.0.0.1:9", "key", transport=httpx.MockTransport(catalog_answer)) as client:
        who = client.whoami()
        [shape] = client.shapes()
        images = client.rootfs()
        [host] = client.hosts()
    assert isinstance(who, paddock.WhoAmI) and who.user_id == "usr_1"
    assert who.stats.total == 3 and who.credits is not None and who.credits.balance == 9.5
    assert shape.id == "s-0.5vcpu-1gb" and shape.cpu_quota_pct == 50
    assert images.default == "debian:13" and images.entries[0].description == "Minimal"
    assert host.free_mib == 512 and host.rootfses == [] and host.extra == {"rack": "r1"}
    # code written when these were dicts keeps working
    assert who["stats"]["total"] == 3 and who.get("nope") is None and "credits" in who
    assert dict(shape) == {
        "id": "s-0.5vcpu-1gb",
        "vcpu": 1,
        "mem_mib": 1024,
        "default_disk_mib": 10240,
        "cpu_quota_pct": 50,
    }
    assert "rootfses" not in host and host["rack"] == "r1"
    assert images == {
        "rootfs": ["debian:13"],
        "default": "debian:13",
        "entries": [{"name": "debian:13", "description": "Minimal"}],
    }


def test_the_gateway_clients_reads_are_models_named_as_the_wire() -> None:
    from eth_account import Account

    answers: dict[tuple[str, str], Any] = {
        ("GET", "/agent/chains"): {"chains": [{"chain": "base", "chain_id": 8453, "tokens": ["usdc"]}]},
        ("GET", "/agent/recipients"): {
            "updated_at": "2026-04-07T10:00:00.000Z",
            "recipients": [{"chain": "base", "address": "0x11"}],
        },
        ("GET", "/agent/balance/0xabc"): {
            "address": "0xabc",
            "chain": "base",
            "chain_id": 8453,
            "balances": [
                {
                    "token": "usdc",
                    "symbol": "USDC",
                    "address": "0x83",
                    "balance": "1.000000",
                    "balance_raw": "1000000",
                    "decimals": 6,
                }
            ],
        },
        ("GET", "/agent/projects"): {
            "wallet": "0xabc",
            "count": 1,
            "projects": [
                {
                    "id": "p1",
                    "name": "site",
                    "displayName": "Site",
                    "status": "building",
                    "url": None,
                    "createdAt": "2026-04-07T10:00:00.000Z",
                }
            ],
        },
        ("GET", "/agent/deploy/p1/d1/status"): {
            "status": "ready",
            "deployment_id": "d1",
            "endpoint": "http://x",
        },
        ("DELETE", "/agent/projects/p1"): {"projectId": "p1", "status": "deleted"},
    }

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers[(request.method, request.url.path)])

    key = "0x" + Account.create().key.hex().removeprefix("0x")
    with paddock.GatewayClient("http://127.0.0.1:9", key, transport=httpx.MockTransport(answer)) as gateway:
        [chain] = gateway.chains()
        recipients = gateway.recipients()
        balance = gateway.balance("0xabc")
        [project] = gateway.projects()
        status = gateway.status("p1", "d1")
        deleted = gateway.delete_project("p1")
    assert isinstance(chain, paddock.Chain) and chain.chain_id == 8453 and chain.tokens == ["usdc"]
    assert recipients.recipients[0].address == "0x11"
    assert balance.balances[0].balance_raw == "1000000" and balance.balances[0].decimals == 6
    assert project.displayName == "Site" and project.url is None and project.createdAt is not None
    assert status.status == "ready" and status.endpoint == "http://x" and status.reason is None
    assert deleted.projectId == "p1" and deleted.status == "deleted"
    # the CLI and users' code read them as dicts: unchanged
    assert project["url"] is None and {**status} == answers[("GET", "/agent/deploy/p1/d1/status")]
    assert deleted == {"projectId": "p1", "status": "deleted"}


def test_an_answer_without_a_required_field_is_a_protocol_error_naming_it() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "success", "data": {"rootfs": ["debian:13"]}})

    with (
        paddock.Client("http://127.0.0.1:9", "key", transport=httpx.MockTransport(answer)) as client,
        pytest.raises(paddock.ProtocolError, match="RootfsData lacks default"),
    ):
        client.rootfs()

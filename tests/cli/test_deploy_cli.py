"""``paddock deploy DIR``: a subprocess paying a real gateway on real anvil chains, as a user runs it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from paddock_gateway import devchain
from tests.gateway.conftest import (
    RECIPIENT,
    Chain,
    Gateway,
    Wallet,
    new_wallet,
    rpc,
    running_gateway,
    unique_name,
    x402_settings,
)
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]


async def paddock_deploy(
    gw: Gateway, key: str, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_WALLET_KEY": key,
            "PADDOCK_GATEWAY_URL": gw.url,
            "PADDOCK_RPC_URL_BASE": gw.chains["base"].rpc_url,
            "PADDOCK_PAYMENTS_FILE": str(tmp_path / "payments.json"),
        }
    )
    command = [sys.executable, "-m", "paddock_cli.main", "deploy", *args]
    if args[0] not in ("ls", "status", "rm"):
        command += ["--poll-interval", "0.3"]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=180
    )


def key_of(wallet: Wallet) -> str:
    return "0x" + bytes(wallet.account.key).hex()


async def test_deploy_a_directory_shows_progress_and_prints_the_url(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    base = chain_gateway.chains["base"]
    app = tmp_path / "my-site"
    app.mkdir()
    (app / "index.html").write_text("<p>deployed from the CLI</p>")
    port = free_port()
    before = await base.token_balance("usdc", RECIPIENT)
    ran = await paddock_deploy(chain_gateway, key_of(paying_wallet), tmp_path, str(app), "--port", str(port),
                               "--chain", "base", "--token", "usdc")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"http://127.0.0.1:{port}\n"
    stages = [line.split()[0] for line in ran.stderr.splitlines()]
    assert stages[:4] == ["upload", "quote", "payment", "confirmation"] and stages[-1] == "ready"
    assert "build" in stages and "1.813947 USD = 1813947 raw usdc" in ran.stderr
    assert "as my-site-" in ran.stderr  # the default name: the directory's plus a suffix
    async with httpx.AsyncClient() as http:
        assert "deployed from the CLI" in (await http.get(f"http://127.0.0.1:{port}/index.html")).text
    assert await base.token_balance("usdc", RECIPIENT) == before + 1_813_947

    again = await paddock_deploy(chain_gateway, key_of(paying_wallet), tmp_path, str(app), "--json",
                                 "--name", unique_name("json"), "--port", str(free_port()))  # fmt: skip
    assert again.returncode == 0, again.stderr
    deployment = json.loads(again.stdout)
    assert deployment["status"] == "ready" and deployment["tx_hash"].startswith("0x")


async def test_deploy_exit_codes(chain_gateway: Gateway, tmp_path: Path) -> None:
    poor = new_wallet()
    await rpc(chain_gateway.chains["base"].rpc_url, "anvil_setBalance", [poor.address, hex(10**18)])
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "index.html").write_text("x")
    short = await paddock_deploy(chain_gateway, key_of(poor), tmp_path, str(tmp_path / "app"))
    assert short.returncode == 6 and "holds 0 raw usdc" in short.stderr
    assert "quote" in short.stderr and "payment " not in short.stderr
    missing = await paddock_deploy(chain_gateway, key_of(poor), tmp_path, str(tmp_path / "nope"))
    assert missing.returncode == 2
    bad_name = await paddock_deploy(
        chain_gateway, key_of(poor), tmp_path, str(tmp_path / "app"), "--name", "x"
    )
    assert bad_name.returncode == 1 and "invalid_body" in bad_name.stderr


async def test_deploy_ls_status_rm_manage_the_wallets_projects(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    """After a deploy, `deploy ls`, `deploy status NAME [DEPLOYMENT_ID]` and `deploy rm NAME` through
    the gateway's own routes, signed by the wallet, in tables and in --json."""
    key = key_of(paying_wallet)
    app = tmp_path / "managed"
    app.mkdir()
    (app / "index.html").write_text("<p>to be listed and removed</p>")
    name, port = unique_name("managed"), free_port()
    made = await paddock_deploy(chain_gateway, key, tmp_path, str(app), "--name", name, "--port", str(port),
                                "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    deployment = json.loads(made.stdout)

    listed = await paddock_deploy(chain_gateway, key, tmp_path, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    [project] = [p for p in json.loads(listed.stdout) if p["name"] == name]
    assert project["id"] == deployment["project_id"] and project["status"] == "active"
    assert project["url"] == f"http://127.0.0.1:{port}"
    table = await paddock_deploy(chain_gateway, key, tmp_path, "ls")
    assert table.stdout.splitlines()[0].split() == ["NAME", "ID", "STATUS", "URL", "CREATED"]
    assert any(line.split()[:3] == [name, project["id"], "active"] for line in table.stdout.splitlines())

    by_name = await paddock_deploy(chain_gateway, key, tmp_path, "status", name, "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["url"] == f"http://127.0.0.1:{port}"
    one = await paddock_deploy(chain_gateway, key, tmp_path, "status", project["id"],
                               deployment["deployment_id"], "--json")  # fmt: skip
    assert one.returncode == 0, one.stderr
    shown = json.loads(one.stdout)
    assert shown["status"] == "ready" and shown["endpoint"] == f"http://127.0.0.1:{port}"
    assert shown["deployment_id"] == deployment["deployment_id"] and shown["project"]["name"] == name
    plain = await paddock_deploy(chain_gateway, key, tmp_path, "status", name, deployment["deployment_id"])
    assert "status" in plain.stdout and "ready" in plain.stdout

    # another wallet sees none of it and cannot remove it
    stranger = key_of(new_wallet())
    theirs = await paddock_deploy(chain_gateway, stranger, tmp_path, "ls", "--json")
    assert theirs.returncode == 0 and json.loads(theirs.stdout) == []
    refused = await paddock_deploy(chain_gateway, stranger, tmp_path, "rm", name)
    assert refused.returncode == 4 and f"no project named '{name}'" in refused.stderr

    removed = await paddock_deploy(chain_gateway, key, tmp_path, "rm", name, "--json")
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout) == {"projectId": project["id"], "status": "deleted"}
    after = await paddock_deploy(chain_gateway, key, tmp_path, "ls", "--json")
    left = [p for p in json.loads(after.stdout) if p["name"] == name]
    assert left == [] or left[0]["status"] == "deleting", left
    missing = await paddock_deploy(chain_gateway, key, tmp_path, "status", "no-such-project")
    assert missing.returncode == 4 and "no project named 'no-such-project'" in missing.stderr


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_blocks(language: str, marker: str) -> list[str]:
    import re

    blocks = re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    return [block for block in blocks if marker in block]


async def test_the_readme_gateway_examples_run(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    """The README's GatewayClient block and its ``paddock deploy`` line, as written; only the project
    name and the port are made unique for this run."""
    [python_block] = readme_blocks("python", "GatewayClient()")
    [sh_block] = readme_blocks("sh", "paddock deploy ./site")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<p>from the README</p>")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_WALLET_KEY": key_of(paying_wallet),
            "PADDOCK_GATEWAY_URL": chain_gateway.url,
            "PADDOCK_RPC_URL_BASE": chain_gateway.chains["base"].rpc_url,
            "PADDOCK_PAYMENTS_FILE": str(tmp_path / "payments.json"),
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        }
    )
    for block, command in (
        (python_block, [sys.executable, "-c"]),
        (sh_block, ["bash", "-euo", "pipefail", "-c"]),
    ):
        port = free_port()
        script = block.replace("my-site-3f9a1c", unique_name("readme")).replace("8000", str(port))
        ran = await asyncio.to_thread(
            subprocess.run,
            [*command, script],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith(f"http://127.0.0.1:{port}")
        async with httpx.AsyncClient() as http:
            assert "from the README" in (await http.get(f"http://127.0.0.1:{port}/index.html")).text


@pytest.fixture
async def x402_gateway(tmp_path: Path, devchains: dict[str, Chain]) -> AsyncIterator[Gateway]:
    async with running_gateway(x402_settings(tmp_path, devchains), tmp_path, chains=devchains) as gw:
        yield gw


async def test_deploy_x402_pays_by_signature_without_an_rpc_url_or_gas(
    x402_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    base = x402_gateway.chains["base"]
    app = tmp_path / "signed-site"
    app.mkdir()
    (app / "index.html").write_text("<p>paid with x402 from the CLI</p>")
    port = free_port()
    before = await base.token_balance("usdc", RECIPIENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_WALLET_KEY": key_of(paying_wallet),
            "PADDOCK_GATEWAY_URL": x402_gateway.url,
            "PADDOCK_PAYMENTS_FILE": str(tmp_path / "payments.json"),
        }
    )  # no PADDOCK_RPC_URL_*: x402 needs none
    command = [sys.executable, "-m", "paddock_cli.main", "deploy", str(app), "--port", str(port), "--x402",
               "--poll-interval", "0.3", "--json"]  # fmt: skip
    ran = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["url"] == f"http://127.0.0.1:{port}" and out["status"] == "ready"
    assert "x402 authorization signed" in ran.stderr and f"settled it in {out['tx_hash']}" in ran.stderr
    receipt = await base.receipt(out["tx_hash"])
    assert receipt is not None and receipt["from"].lower() == devchain.SETTLEMENT_ADDRESS.lower()
    assert await base.token_balance("usdc", RECIPIENT) == before + 1_813_947
    assert int(await rpc(base.rpc_url, "eth_getTransactionCount", [paying_wallet.address, "latest"]), 16) == 0
    async with httpx.AsyncClient() as http:
        assert "paid with x402" in (await http.get(f"http://127.0.0.1:{port}/index.html")).text

"""Deployments that really run: Node, Python, static, failures with their log tail, Dockerfile refused."""

from __future__ import annotations

import io
import json
import zipfile
from decimal import Decimal
from typing import Any

import httpx
import pytest

from paddock_gateway.adapters.hosting import DeployOptions, UploadedFile
from paddock_gateway.runtimes import NO_COMMAND, PlanError, infer_plan
from tests.gateway.conftest import Gateway, Wallet, b64, new_wallet, unique_name
from tests.ports import free_port

NODE_SERVER = """
const http = require("http");
const fs = require("fs");
const built = fs.readFileSync("dist/built.txt", "utf8");
http.createServer((req, res) => res.end(`node ${built} ${process.env.SECRET_WORD}`)).listen(process.env.PORT);
"""
NODE_BUILD = 'require("fs").mkdirSync("dist",{recursive:true});require("fs").writeFileSync("dist/built.txt",process.env.GREETING);'
PYTHON_APP = """
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"python {os.environ.get('MODE')}".encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
"""


def request(files: dict[str, str], port: int, **settings: Any) -> dict[str, Any]:
    return {
        "uniqueName": unique_name("rt"),
        "displayName": "Runtime test",
        "settings": {"port": port, **settings},
        "upload": {"type": "files", "files": [{"path": p, "content": b64(c)} for p, c in files.items()]},
    }


async def deploy_and_wait(gw: Gateway, wallet: Wallet, body: dict[str, Any]) -> dict[str, Any]:
    response = await gw.deploy(wallet, body)
    assert response.status_code == 200, response.text
    started = response.json()
    return await gw.wait_terminal(wallet, started["projectId"], started["deploymentId"])


@pytest.fixture
async def funded(gateway: Gateway) -> Wallet:
    wallet = new_wallet()
    await gateway.grant_credits(wallet, Decimal("50"))
    return wallet


@pytest.mark.slow
async def test_node_app_with_build_vars_and_run_envs(gateway: Gateway, funded: Wallet) -> None:
    port = free_port()
    package = {"name": "demo", "scripts": {"build": "node build.js", "start": "node server.js"}}
    body = request(
        {"package.json": json.dumps(package), "server.js": NODE_SERVER, "build.js": NODE_BUILD},
        port,
        buildVars={"GREETING": "built-with-vars"},
        runEnvs={"SECRET_WORD": "applied"},
    )
    final = await deploy_and_wait(gateway, funded, body)
    assert final["status"] == "ready", final
    async with httpx.AsyncClient() as http:
        assert (await http.get(final["endpoint"])).text == "node built-with-vars applied"


@pytest.mark.slow
async def test_python_app_from_a_zip_subdirectory(gateway: Gateway, funded: Wallet) -> None:
    port = free_port()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("README.md", "not the app")
        archive.writestr("backend/app.py", PYTHON_APP)
        archive.writestr("backend/requirements.txt", "# stdlib only\n")
    body = request({}, port, directoryPath="backend", runEnvs={"MODE": "zipped"})
    body["upload"] = {"type": "zip", "data": b64(buffer.getvalue()), "filename": "code.zip"}
    final = await deploy_and_wait(gateway, funded, body)
    assert final["status"] == "ready", final
    async with httpx.AsyncClient() as http:
        assert (await http.get(final["endpoint"])).text == "python zipped"


@pytest.mark.slow
async def test_explicit_run_command_wins(gateway: Gateway, funded: Wallet) -> None:
    port = free_port()
    body = request(
        {"index.html": "<p>ignored</p>", "other/page.txt": "from runCommand"},
        port,
        runCommand=f"python3 -m http.server {port} --directory other",
    )
    final = await deploy_and_wait(gateway, funded, body)
    async with httpx.AsyncClient() as http:
        assert (await http.get(final["endpoint"] + "/page.txt")).text == "from runCommand"


@pytest.mark.slow
async def test_crashing_app_fails_with_its_output(gateway: Gateway, funded: Wallet) -> None:
    package = {
        "name": "crash",
        "scripts": {"start": "node -e \"console.error('boom: missing DATABASE_URL'); process.exit(3)\""},
    }
    final = await deploy_and_wait(
        gateway, funded, request({"package.json": json.dumps(package)}, free_port())
    )
    assert final["status"] == "failed"
    assert final["deployment_status"] == "failed"
    assert "boom: missing DATABASE_URL" in final["reason"]


@pytest.mark.slow
async def test_failing_build_reports_the_step(gateway: Gateway, funded: Wallet) -> None:
    body = request({"index.html": "x"}, free_port(), buildCommand="echo compiling; exit 7")
    final = await deploy_and_wait(gateway, funded, body)
    assert final["status"] == "failed"
    assert final["reason"].startswith("build failed") and "compiling" in final["reason"]


async def test_a_dockerfile_needs_a_platform_with_templates(gateway: Gateway, funded: Wallet) -> None:
    body = request({"Dockerfile": 'FROM debian:13\nCMD ["x"]'}, free_port(), hasDockerfile=True)
    final = await deploy_and_wait(gateway, funded, body)
    assert final["status"] == "failed" and "need a hosting platform with templates" in final["reason"]


@pytest.mark.slow
async def test_an_app_its_ingress_url_cannot_reach_is_not_ready(gateway: Gateway, funded: Wallet) -> None:
    gateway.provider.ingress_url_template = "http://127.0.0.1:9/<port>"  # type: ignore[attr-defined]
    gateway.services.hosting.ready_timeout_s = 2  # type: ignore[attr-defined]
    final = await deploy_and_wait(gateway, funded, request({"index.html": "x"}, free_port()))
    assert final["status"] == "failed"
    assert final["reason"].startswith("the app answers inside its sandbox but not at its ingress URL")


def files(**contents: str) -> list[UploadedFile]:
    return [UploadedFile(path=name.replace("__", "/"), data=data.encode()) for name, data in contents.items()]


def test_inference_rules() -> None:
    node = infer_plan(
        [
            UploadedFile(
                "package.json", json.dumps({"dependencies": {"express": "4"}, "main": "srv.js"}).encode()
            ),
            UploadedFile("package-lock.json", b"{}"),
            UploadedFile("srv.js", b""),
        ],
        DeployOptions(port=8080),
    )
    assert (node.kind, node.install, node.build, node.run) == ("node", "npm ci", None, "node srv.js")
    assert node.run_env["PORT"] == "8080"

    fastapi = infer_plan(files(**{"main.py": "", "requirements.txt": "fastapi\nuvicorn\n"}), DeployOptions())
    assert fastapi.install and "pip install -r requirements.txt" in fastapi.install
    assert fastapi.run == ".venv/bin/python -m uvicorn main:app --host 0.0.0.0 --port 3000"
    flask = infer_plan(files(**{"app.py": "", "requirements.txt": "flask"}), DeployOptions(port=5000))
    assert flask.run.endswith("-m flask --app app run --host 0.0.0.0 --port 5000")
    static = infer_plan(files(**{"index.html": "<p>"}), DeployOptions(port=80))
    assert static.kind == "static" and static.install is None and "http.server 80" in static.run
    spa = infer_plan(
        files(**{"package.json": json.dumps({"scripts": {"build": "vite build"}})}),
        DeployOptions(build_dir="dist", build_flag="--mode prod"),
    )
    assert spa.build == "npm run build --mode prod" and "--directory dist" in spa.run
    custom = infer_plan(
        files(**{"x.txt": ""}), DeployOptions(run_command="./serve", run_flag="-v", use_build_ai=False)
    )
    assert custom.run == "./serve -v"
    with pytest.raises(PlanError, match="cannot tell how to run"):
        infer_plan(files(**{"notes.txt": ""}), DeployOptions())
    with pytest.raises(PlanError, match="no Dockerfile at web/"):
        infer_plan(
            files(**{"Dockerfile": "", "web__index.html": ""}),
            DeployOptions(has_dockerfile=True, directory_path="web"),
        )
    with pytest.raises(PlanError) as no_command:
        infer_plan(files(**{"Dockerfile": "FROM debian:13"}), DeployOptions(has_dockerfile=True))
    assert str(no_command.value) == NO_COMMAND
    # A Dockerfile and nothing else to run: the Dockerfile is the build.
    docker = infer_plan(
        files(**{"Dockerfile": 'FROM debian:13\nCMD ["python3", "-m", "http.server"]'}), DeployOptions()
    )
    assert (docker.kind, docker.install, docker.build, docker.run) == (
        "dockerfile",
        None,
        None,
        "python3 -m http.server",
    )
    combined = infer_plan(
        files(
            **{
                "web__Dockerfile": 'FROM x\nENTRYPOINT ["node"]\nCMD ["srv.js", "--port", "$PORT"]',
                "package.json": "{}",
            }
        ),
        DeployOptions(has_dockerfile=True, directory_path="web", run_flag="-v"),
    )
    assert combined.kind == "dockerfile" and combined.workdir == "web"
    assert combined.run == "node srv.js --port '$PORT' -v"
    shell_form = infer_plan(
        files(**{"Dockerfile": "FROM x\nCMD ./serve \\\n  --fast"}), DeployOptions(has_dockerfile=True)
    )
    assert shell_form.run == "./serve --fast"
    overridden = infer_plan(
        files(**{"Dockerfile": "FROM x"}), DeployOptions(has_dockerfile=True, run_command="./go")
    )
    assert overridden.run == "./go"

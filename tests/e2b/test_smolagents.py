"""One agent framework's E2B integration, unchanged: smolagents' ``E2BExecutor`` (pyproject's test
extra), configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, runs code in a real Paddock
sandbox. No model is involved: the executor is called with code, as smolagents' own tests do. The code's
effects are read back through ``/v1`` (a file it wrote, the sandbox's hostname), so it ran in Paddock
and nowhere else. On the code before the E2B API nothing listened and the executor could not start."""

from __future__ import annotations

from pathlib import Path

import pytest
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import E2BExecutor
from smolagents.utils import AgentError

import paddock
from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2bPlatform
from tests.hostagent.conftest import image_cache

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def interpreter_image() -> Path:
    return ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build


def test_smolagents_e2b_executor_runs_code_in_a_paddock_sandbox(
    e2b_env: E2bPlatform, interpreter_image: Path
) -> None:
    executor = E2BExecutor(additional_imports=[], logger=AgentLogger(level=LogLevel.OFF))
    try:
        sandbox_id = executor.sandbox.sandbox_id
        with e2b_env.platform.http(e2b_env.api_key) as http:
            view = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
            assert view["status"] == "running" and view["rootfs"] == "code-interpreter:1", view

            written = executor(
                "import socket\n"
                "name = socket.gethostname()\n"
                "open('/tmp/from-smolagents.txt', 'w').write('agent ran on ' + name)\n"
                "print('wrote', len(name))"
            )
            assert not written.is_final_answer and written.logs.startswith("wrote "), written
            answer = executor("x = 6 * 7\nx")  # state kept between calls, the last expression returned
            assert str(answer.output) == "42", answer

            read = http.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/tmp/from-smolagents.txt"})
            assert read.status_code == 200, read.text
            with paddock.Client(e2b_env.platform.url, e2b_env.api_key) as client:
                hostname = client.sandboxes.get(sandbox_id).run("hostname").stdout.strip()
            assert hostname and read.text == f"agent ran on {hostname}", (read.text, hostname)

            with pytest.raises(AgentError, match="ZeroDivisionError"):
                executor("1 / 0")  # an error in the code is the framework's own AgentError
    finally:
        executor.cleanup()

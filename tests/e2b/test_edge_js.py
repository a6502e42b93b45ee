"""The unmodified E2B JS SDKs (``e2b`` and ``@e2b/code-interpreter`` from npm, pinned by
tests/e2b/js/package-lock.json; ``make setup-test`` runs ``npm ci`` there) under Node against a live
Paddock, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY: commands (streaming, envs, a
failure, stdin, background, kill), files (5 MiB, list, stat, remove, not found), a directory watch, a
PTY, and the code interpreter with state, an error and a PNG chart. Fails on the code before the edge
(nothing listened on E2B_SANDBOX_URL)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2bPlatform
from tests.hostagent.conftest import image_cache

pytestmark = [pytest.mark.root, pytest.mark.slow]

JS = Path(__file__).with_name("js")


def test_js_sdks_core_steps(e2b_platform: E2bPlatform) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
    assert (JS / "node_modules" / "e2b").is_dir(), "run make setup-test (npm ci in tests/e2b/js)"
    ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build
    env = (
        {key: value for key, value in os.environ.items() if not key.startswith("E2B_")}
        | e2b_platform.env
        | {"PADDOCK_E2B_JS_INTERPRETER": "1"}
    )
    done = subprocess.run(
        [node, "core.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ok"] is True
    assert seen["run"] == "one\nhi\n"
    assert "create:new.txt" in seen["watch"]
    assert seen["network"] == ["192.0.2.1"]  # updateNetwork (PUT /sandboxes/{id}/network)
    assert seen["denied"] == ["192.0.2.9", "198.51.100.0/24"]  # a denyOut of some addresses, as given
    # maskRequestHost, httpsPorts and a domain's DNS server, as the JS SDK sends and reads them
    assert seen["networkOptions"] == ["${PORT}-js.example.test", [8443], ["api.example.test", "8.8.8.8"]]
    assert seen["interpreter"] == "42"
    assert seen["interpreterEnvs"] == ["'from-js'", "False"]  # runCode's envs, for that cell alone

"""The SDK installs alone: ``import paddock`` needs neither the servers nor the wallet extra."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_gateway_client_is_loaded_only_when_used() -> None:
    blocked = "import sys; sys.modules.update({m: None for m in ['eth_account', 'web3']});"
    plain = run(blocked + "import paddock, paddock.webhooks; c = paddock.Client; print(c.__name__)")
    assert plain.returncode == 0 and plain.stdout.strip() == "Client", plain.stderr
    wallet = run(blocked + "import paddock; paddock.GatewayClient")
    assert wallet.returncode == 1 and "pip install 'paddock[wallet]'" in wallet.stderr
    loaded = run("import sys, paddock; print('web3' in sys.modules); paddock.GatewayClient; print('ok')")
    assert loaded.stdout.split() == ["False", "ok"]

"""The control plane as the gateway's own account, for the sandboxes wallets rent (``agent_sandboxes``),
and the per-second price of a shape: the control plane's own compute price (spec §13.3), per second,
rounded up to a whole 10^-6 USD (a raw USDC/USDT unit)."""

from __future__ import annotations

import paddock
from paddock_gateway.errors import UpstreamUnavailable
from paddock_gateway.settings import GatewaySettings

#: The control plane's compute price (§13.3), in micro-credits per second (100 credits per USD).
MICRO_PER_VCPU_SECOND = 1400
MICRO_PER_GIB_SECOND = 450
#: Micro-credits per 10^-6 USD (raw token unit).
MICRO_CREDITS_PER_RAW = 100


def rate_raw(vcpu: int, cpu_quota_pct: int | None, mem_mib: int) -> int:
    """10^-6 USD per second of running, rounded up (the control plane's ``cost_micro`` for one second)."""
    cpu_hundredths = cpu_quota_pct if cpu_quota_pct is not None else vcpu * 100
    numerator = cpu_hundredths * MICRO_PER_VCPU_SECOND * 1024 + mem_mib * MICRO_PER_GIB_SECOND * 100
    denominator = 100 * 1024 * MICRO_CREDITS_PER_RAW
    return max(1, -(-numerator // denominator))


class ControlPlane:
    """The control plane as the gateway's own account (its API key), through the SDK."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.url = settings.controlplane_url.rstrip("/")
        self.client = paddock.AsyncClient(
            base_url=self.url, api_key=settings.api_key.get_secret_value() or None, timeout=180
        )
        self.rates: dict[str, int] = {}

    async def rate(self, shape: str) -> int | None:
        if not self.rates:
            try:
                shapes = await self.client.shapes()
            except paddock.PaddockError as exc:
                raise UpstreamUnavailable("the control plane's shape catalog is unavailable") from exc
            self.rates = {s.id: rate_raw(s.vcpu, s.cpu_quota_pct, s.mem_mib) for s in shapes}
        return self.rates.get(shape)

    async def sandbox(self, sandbox_id: str) -> paddock.AsyncSandbox:
        try:
            return await self.client.sandboxes.get(sandbox_id)
        except paddock.TransportError as exc:
            raise UpstreamUnavailable("the control plane is unavailable") from exc

    async def aclose(self) -> None:
        await self.client.aclose()

"""Gateway settings (env prefix ``PADDOCK_GW_``), the configuration of the contract's §12.

Built in ``main()`` and passed down. Per-chain values are flat fields (``rpc_url_base``,
``chain_id_arbitrum``, ``token_base_usdc`` …) so each is one environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from paddock_core import statefiles
from paddock_core.crypto import SecretBox
from paddock_core.settings import DEFAULT_DATA_DIR, DatabaseSettingsMixin, ServiceSettings, sqlite_url
from paddock_gateway.registry import KNOWN_CHAINS, ChainSpec, Registry, TokenSpec, checksum


class GatewaySettings(DatabaseSettingsMixin, ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="PADDOCK_GW_", extra="ignore")

    port: int = 8082
    data_dir: Path = DEFAULT_DATA_DIR
    #: The address every payment goes to (``pay_to``), on every chain unless overridden below.
    recipient: str = ""
    recipient_base: str = ""
    recipient_arbitrum: str = ""
    #: JSON-RPC endpoints. Production points them at real Base / Arbitrum One RPCs.
    rpc_url_base: str = ""
    rpc_url_arbitrum: str = ""
    #: Overrides for tests against local nodes only; the defaults are the real chains.
    chain_id_base: int = 8453
    chain_id_arbitrum: int = 42161
    token_base_usdc: str = ""
    token_base_usdt: str = ""
    token_arbitrum_usdc: str = ""
    token_arbitrum_usdt: str = ""
    confirmations_base: int = 1
    confirmations_arbitrum: int = 1
    #: A dev-chain file written by ``python -m paddock_gateway.devchain up``; fills the RPC URLs.
    devchain_file: Path | None = None
    rpc_timeout_s: float = 10.0
    #: Smart wallets (EIP-1271/ERC-6492): how long one on-chain signature check may take, and how long its
    #: answer is kept per (chain, address, hash, signature).
    contract_signature_timeout_s: float = 5.0
    contract_signature_cache_s: float = 30.0
    #: x402 (Appendix B): the key that submits ``transferWithAuthorization`` settlements and pays their
    #: gas. Empty: the gateway neither offers nor accepts x402 payments.
    settlement_private_key: SecretStr = SecretStr("")
    settlement_receipt_timeout_s: float = 30.0
    #: The public base URL (e.g. ``https://gateway.example``) for x402's ``resource.url``.
    public_url: str = ""

    #: Pricing: a static monthly price, unless ``pricing_url`` names an upstream that answers
    #: ``{"<pricing_field>": <credits per month>}``.
    static_monthly_usd: Decimal = Decimal("2.00")
    pricing_url: str = ""
    pricing_field: str = "credits"
    price_cache_ttl_s: float = 300.0
    price_retry_backoff_s: float = 30.0
    min_monthly_usd: Decimal = Decimal("0.50")
    credits_per_usd: int = 100

    rate_limit_requests: int = 30
    rate_limit_window_s: int = 60
    trusted_proxies: list[str] = Field(default_factory=list)
    max_body_bytes: int = 52_428_800
    timestamp_skew_ms: int = 60_000
    nonce_retention_s: int = 120

    #: Hourly metering: how often the worker looks for hours that have ended.
    metering_interval_s: float = 60.0
    hours_per_month: int = 730
    #: x402 ``upto`` (``upto.py``): the length of one month of an authorisation's period (730 hours, as
    #: hourly metering counts a month), and the settlement window: a permit must stay valid this long
    #: after its period ends, and the gateway settles no later than this long before its deadline.
    upto_month_s: int = Field(default=730 * 3600, ge=1)
    upto_settle_window_s: int = Field(default=900, ge=30)

    #: Key material for secrets at rest (a deployment's ``runEnvs`` and ``buildVars``). When unset, a
    #: random key is generated once into ``<data_dir>/gateway-secret.key`` (mode 0600).
    secret_key: SecretStr = SecretStr("")

    #: The hosting side: Paddock's control plane, reached through the SDK.
    controlplane_url: str = "http://127.0.0.1:8080"
    api_key: SecretStr = SecretStr("")
    sandbox_shape: str = "s-1vcpu-1gb"
    #: Debian 13 with python3/pip/venv, node/npm, git and build-essential (``make images`` builds it).
    sandbox_rootfs: str = "devbox:1"
    install_timeout_s: float = 900.0
    build_timeout_s: float = 900.0
    ready_timeout_s: float = 120.0
    max_concurrent_builds: int = 2
    #: A deployment is ready only once its ingress URL reaches the app from here too (not only
    #: ``curl 127.0.0.1:<port>`` inside the sandbox). Off for platforms whose ingress the gateway
    #: cannot reach.
    verify_ingress: bool = True

    @field_validator("secret_key")
    @classmethod
    def _not_placeholder(cls, value: SecretStr) -> SecretStr:
        if value.get_secret_value():
            return cls.reject_placeholder(value, "secret_key")
        return value

    @field_validator("settlement_private_key")
    @classmethod
    def _settlement_key(cls, value: SecretStr) -> SecretStr:
        key = value.get_secret_value()
        if key:
            cls.reject_placeholder(value, "settlement_private_key")
            if not re.fullmatch(r"(0x)?[0-9a-fA-F]{64}", key):
                # Never echo the value: it is meant to be a private key.
                raise ValueError("settlement_private_key must be 32 bytes of hex")
        return value

    @field_validator("recipient", "recipient_base", "recipient_arbitrum")
    @classmethod
    def _address(cls, value: str) -> str:
        return checksum(value) if value else value

    @model_validator(mode="after")
    def _defaults(self) -> GatewaySettings:
        if not self.database_url:
            self.database_url = sqlite_url(self.data_dir / "gateway.db")
        if self.devchain_file is not None and self.devchain_file.exists():
            self.apply_devchain(json.loads(self.devchain_file.read_text()))
        return self

    def apply_devchain(self, info: dict[str, Any]) -> None:
        """Take RPC URLs, chain ids and token contracts from a dev-chain file for unset fields."""
        for name, chain in info.get("chains", {}).items():
            if not getattr(self, f"rpc_url_{name}", "x"):
                setattr(self, f"rpc_url_{name}", chain["rpc_url"])
            setattr(self, f"chain_id_{name}", int(chain["chain_id"]))
            for token, address in chain.get("tokens", {}).items():
                if not getattr(self, f"token_{name}_{token}", "x"):
                    setattr(self, f"token_{name}_{token}", address)
        if not self.recipient and info.get("recipient"):
            self.recipient = checksum(info["recipient"])
        settlement = info.get("settlement") or {}
        if not self.settlement_private_key.get_secret_value() and settlement.get("private_key"):
            self.settlement_private_key = SecretStr(settlement["private_key"])

    def secret_box(self) -> SecretBox:
        """The at-rest box: the configured key, else one generated once into the data dir."""
        key = self.secret_key.get_secret_value()
        if not key:
            path = self.data_dir / "gateway-secret.key"
            if not path.exists():
                statefiles.private_dir(path.parent)
                with contextlib.suppress(FileExistsError):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as handle:
                        handle.write(secrets.token_urlsafe(32) + "\n")
            key = path.read_text().strip()
        return SecretBox(key)

    def registry(self) -> Registry:
        if not self.recipient:
            raise ValueError("PADDOCK_GW_RECIPIENT (the pay_to address) is not set")
        chains: dict[str, ChainSpec] = {}
        for name, _, tokens in KNOWN_CHAINS:
            chains[name] = ChainSpec(
                name=name,
                chain_id=getattr(self, f"chain_id_{name}"),
                rpc_url=getattr(self, f"rpc_url_{name}"),
                recipient=getattr(self, f"recipient_{name}") or self.recipient,
                confirmations=max(1, getattr(self, f"confirmations_{name}")),
                tokens={
                    token: TokenSpec(
                        name=token,
                        symbol=symbol,
                        address=checksum(getattr(self, f"token_{name}_{token}") or address),
                    )
                    for token, (symbol, address) in tokens.items()
                },
            )
        return Registry(chains=chains, default_chain="base")

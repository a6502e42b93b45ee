"""The chain and token registry of the contract (§2.4), with the per-deployment configuration on top.

The registry is the source of truth for token contracts and decimals: the gateway never reads
``symbol()`` or ``decimals()`` from a chain. Tests against local nodes may override the chain ids and
the token contracts; the wire names (``base``, ``arbitrum``, ``usdc``, ``usdt``) never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eth_utils.address import is_hex_address, to_checksum_address

TOKEN_DECIMALS = 6

#: (chain, chain_id, {token: (symbol, contract)}) in the contract's order: base, arbitrum; usdc, usdt.
KNOWN_CHAINS: tuple[tuple[str, int, dict[str, tuple[str, str]]], ...] = (
    (
        "base",
        8453,
        {
            "usdc": ("USDC", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"),
            "usdt": ("USDT", "0xfde4C96c8593536E31F229EA8f37b2ADa2699bb2"),
        },
    ),
    (
        "arbitrum",
        42161,
        {
            "usdc": ("USDC", "0xaf88d065e77c8cC2239327C5EDb3A432268e5831"),
            "usdt": ("USDT", "0xFd086bC7CD5C481DCC9C85ebE478A1C0b69FCbb9"),
        },
    ),
)
CHAIN_NAMES = tuple(name for name, _, _ in KNOWN_CHAINS)
TOKEN_NAMES = ("usdc", "usdt")


@dataclass(frozen=True)
class TokenSpec:
    name: str
    symbol: str
    address: str  # EIP-55
    decimals: int = TOKEN_DECIMALS


@dataclass(frozen=True)
class ChainSpec:
    name: str
    chain_id: int
    rpc_url: str
    recipient: str  # EIP-55
    confirmations: int = 1
    tokens: dict[str, TokenSpec] = field(default_factory=dict)

    def token(self, name: str) -> TokenSpec:
        return self.tokens[name]


@dataclass(frozen=True)
class Registry:
    chains: dict[str, ChainSpec]
    default_chain: str = "base"

    def chain(self, name: str) -> ChainSpec:
        return self.chains[name]

    def ordered(self) -> list[ChainSpec]:
        return [self.chains[name] for name in CHAIN_NAMES if name in self.chains]

    def supported_chains(self) -> list[dict[str, object]]:
        """The items of ``GET /agent/chains`` and of a quote's ``supported_chains``."""
        return [
            {
                "chain": spec.name,
                "chain_id": spec.chain_id,
                "tokens": [t for t in TOKEN_NAMES if t in spec.tokens],
            }
            for spec in self.ordered()
        ]


def checksum(address: str) -> str:
    if not is_hex_address(address):
        raise ValueError(f"not an EVM address: {address!r}")
    return to_checksum_address(address)


def normalise_name(value: str | None, allowed: tuple[str, ...]) -> str | None:
    """Case-insensitive match of a chain or token name; ``None`` when it is not one of ``allowed``."""
    if value is None:
        return None
    lowered = value.strip().lower()
    return lowered if lowered in allowed else None

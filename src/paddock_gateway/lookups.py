"""The public lookups: token balances (§5.7), chains (§5.8), recipients (§5.9)."""

from __future__ import annotations

from paddock_core.timeutil import rfc3339
from paddock_gateway.adapters.chain import ChainError
from paddock_gateway.auth import ADDRESS_RE
from paddock_gateway.errors import InvalidAddress, UnsupportedChain, UpstreamUnavailable
from paddock_gateway.registry import CHAIN_NAMES, TOKEN_NAMES, checksum, normalise_name
from paddock_gateway.schemas import (
    BalanceBody,
    ChainItem,
    ChainsBody,
    RecipientItem,
    RecipientsBody,
    TokenBalance,
)
from paddock_gateway.services import Services


def format_units(raw: int, decimals: int) -> str:
    whole, fraction = divmod(raw, 10**decimals)
    return f"{whole}.{fraction:0{decimals}d}"


async def balance(services: Services, address: str, chain_name: str | None) -> BalanceBody:
    if not ADDRESS_RE.match(address):
        raise InvalidAddress()
    chain = normalise_name(
        chain_name if chain_name is not None else services.registry.default_chain, CHAIN_NAMES
    )
    if chain is None:
        raise UnsupportedChain()
    spec = services.registry.chain(chain)
    client = services.chain_client(chain)
    balances: list[TokenBalance] = []
    try:
        for name in TOKEN_NAMES:
            token = spec.token(name)
            raw = await client.balance_of(token.address, address)
            balances.append(
                TokenBalance(
                    token=name,
                    symbol=token.symbol,
                    address=token.address,
                    balance=format_units(raw, token.decimals),
                    balance_raw=str(raw),
                    decimals=token.decimals,
                )
            )
    except ChainError as exc:
        raise UpstreamUnavailable(f"the {chain} RPC is unavailable") from exc
    return BalanceBody(address=checksum(address), chain=chain, chain_id=spec.chain_id, balances=balances)


def chains(services: Services) -> ChainsBody:
    return ChainsBody(
        chains=[ChainItem.model_validate(item) for item in services.registry.supported_chains()]
    )


def recipients(services: Services) -> RecipientsBody:
    return RecipientsBody(
        updated_at=rfc3339(services.started_at),
        recipients=[
            RecipientItem(chain=spec.name, address=spec.recipient) for spec in services.registry.ordered()
        ],
    )

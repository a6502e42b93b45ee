"""The EIP-712 typed data of a Permit2 ``PermitWitnessTransferFrom`` as x402 signs it, for its ``exact``
proxy and its ``upto`` proxy, and the ERC-20 calls that give Permit2 its allowance. Plain data, no
dependencies; pass a result to eth-account (``sign_typed_data(full_message=…)``).

Permit2's domain has no version: ``{name: "Permit2", chainId, verifyingContract: Permit2}``.

- ``exact``: spender x402's exact proxy, witness ``Witness(address to,uint256 validAfter)``; the proxy
  moves exactly ``permitted.amount`` to ``witness.to``.
- ``upto``: spender x402's upto proxy, witness ``Witness(address to,address facilitator,uint256
  validAfter)``; the proxy moves at most ``permitted.amount``, only when ``witness.facilitator`` sends it.

Either way Permit2 pulls the tokens with the payer's ERC-20 allowance to Permit2, which the payer gives
once per token (``approve_calldata``).
"""

from __future__ import annotations

from typing import Any

#: One address on every EVM chain (CREATE2): Permit2, x402's exact and upto Permit2 proxies.
PERMIT2_ADDRESS = "0x000000000022D473030F116dDEE9F6B43aC78BA3"
EXACT_PROXY_ADDRESS = "0x402085c248EeA27D92E8b30b2C58ed07f9E20001"
UPTO_PROXY_ADDRESS = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002"
UINT256_MAX = 2**256 - 1

_DOMAIN = [
    {"name": "name", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]
_PERMIT = [
    {"name": "permitted", "type": "TokenPermissions"},
    {"name": "spender", "type": "address"},
    {"name": "nonce", "type": "uint256"},
    {"name": "deadline", "type": "uint256"},
    {"name": "witness", "type": "Witness"},
]
_TOKEN_PERMISSIONS = [{"name": "token", "type": "address"}, {"name": "amount", "type": "uint256"}]
EXACT_TYPES: dict[str, list[dict[str, str]]] = {
    "EIP712Domain": _DOMAIN,
    "PermitWitnessTransferFrom": _PERMIT,
    "TokenPermissions": _TOKEN_PERMISSIONS,
    "Witness": [{"name": "to", "type": "address"}, {"name": "validAfter", "type": "uint256"}],
}
UPTO_TYPES: dict[str, list[dict[str, str]]] = {
    **EXACT_TYPES,
    "Witness": [
        {"name": "to", "type": "address"},
        {"name": "facilitator", "type": "address"},
        {"name": "validAfter", "type": "uint256"},
    ],
}

#: ``approve(address,uint256)`` and ``allowance(address,address)`` selectors.
APPROVE_SELECTOR = "095ea7b3"
ALLOWANCE_SELECTOR = "dd62ed3e"


def permit_witness_transfer_from(
    *,
    chain_id: int,
    token: str,
    amount: int,
    nonce: int,
    deadline: int,
    to: str,
    valid_after: int = 0,
    facilitator: str | None = None,
) -> dict[str, Any]:
    """The full typed-data message: for the exact proxy, or with ``facilitator`` for the upto proxy
    (``amount`` is then the maximum). Addresses go in as given (checksummed is what signers expect)."""
    witness: dict[str, Any] = {"to": to, "validAfter": valid_after}
    if facilitator is not None:
        witness = {"to": to, "facilitator": facilitator, "validAfter": valid_after}
    return {
        "types": EXACT_TYPES if facilitator is None else UPTO_TYPES,
        "primaryType": "PermitWitnessTransferFrom",
        "domain": {"name": "Permit2", "chainId": chain_id, "verifyingContract": PERMIT2_ADDRESS},
        "message": {
            "permitted": {"token": token, "amount": amount},
            "spender": EXACT_PROXY_ADDRESS if facilitator is None else UPTO_PROXY_ADDRESS,
            "nonce": nonce,
            "deadline": deadline,
            "witness": witness,
        },
    }


def _word(value: int | str) -> str:
    if isinstance(value, str):
        return value.lower().removeprefix("0x").rjust(64, "0")
    return f"{value:064x}"


def approve_calldata(amount: int = UINT256_MAX) -> str:
    """``approve(Permit2, amount)``: the payer's one transaction per token before paying by Permit2."""
    return "0x" + APPROVE_SELECTOR + _word(PERMIT2_ADDRESS) + _word(amount)


def allowance_calldata(owner: str) -> str:
    """``allowance(owner, Permit2)`` on the token."""
    return "0x" + ALLOWANCE_SELECTOR + _word(owner) + _word(PERMIT2_ADDRESS)

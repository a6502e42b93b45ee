"""The EIP-712 typed data of an EIP-3009 ``TransferWithAuthorization`` (x402 ``exact`` on EVM chains):
the one definition the SDK signs, the gateway recovers, and the bench and tests sign. Plain data, no
dependencies; pass the result to eth-account (``sign_typed_data`` / ``encode_typed_data``)."""

from __future__ import annotations

from typing import Any

TYPES: dict[str, list[dict[str, str]]] = {
    "EIP712Domain": [
        {"name": "name", "type": "string"},
        {"name": "version", "type": "string"},
        {"name": "chainId", "type": "uint256"},
        {"name": "verifyingContract", "type": "address"},
    ],
    "TransferWithAuthorization": [
        {"name": "from", "type": "address"},
        {"name": "to", "type": "address"},
        {"name": "value", "type": "uint256"},
        {"name": "validAfter", "type": "uint256"},
        {"name": "validBefore", "type": "uint256"},
        {"name": "nonce", "type": "bytes32"},
    ],
}


def transfer_with_authorization(
    *,
    name: str,
    version: str,
    chain_id: int,
    verifying_contract: str,
    sender: str,
    to: str,
    value: int,
    valid_after: int,
    valid_before: int,
    nonce: bytes,
) -> dict[str, Any]:
    """The full typed-data message: the token's EIP-712 domain (``name``/``version`` from the offer's
    ``extra``, the token contract as ``verifyingContract``) and the authorization (``sender`` is
    EIP-3009's ``from``). Values go in as given; ``typed["message"]`` is the authorization signed."""
    return {
        "types": TYPES,
        "primaryType": "TransferWithAuthorization",
        "domain": {
            "name": name,
            "version": version,
            "chainId": chain_id,
            "verifyingContract": verifying_contract,
        },
        "message": {
            "from": sender,
            "to": to,
            "value": value,
            "validAfter": valid_after,
            "validBefore": valid_before,
            "nonce": nonce,
        },
    }

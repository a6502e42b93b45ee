"""x402 ``exact`` by Permit2: the EIP-712 message a payer signs, and the calls that read and settle it.

What an x402 client signs (coinbase/x402 ``specs/schemes/exact/scheme_exact_evm.md``, method 2) is a
Permit2 ``PermitWitnessTransferFrom`` under Permit2's domain, which has no version:

    domain  {name: "Permit2", chainId, verifyingContract: Permit2}
    message {permitted: {token, amount}, spender: x402's exact proxy, nonce, deadline,
             witness: {to, validAfter}}
    types   PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,
            uint256 deadline,Witness witness)TokenPermissions(address token,uint256 amount)
            Witness(address to,uint256 validAfter)

The proxy's ``settle(permit, owner, witness, signature)`` passes it to Permit2's
``permitWitnessTransferFrom``, which checks the deadline, spends the nonce (one bit of the owner's
``nonceBitmap``: word ``nonce >> 8``, bit ``nonce & 0xff``), verifies the signature and moves exactly
``amount`` from the owner to ``witness.to`` with the owner's ERC-20 allowance to Permit2. Pure functions
only: ``settlement.py`` reads and sends.

x402's ``upto`` scheme signs the same message for its upto proxy with the facilitator in the witness,
``Witness(address to,address facilitator,uint256 validAfter)``; that proxy's
``settle(permit, amount, owner, witness, signature)`` moves ``amount`` ≤ ``permitted.amount``, only when sent
by ``witness.facilitator`` (``upto.py`` settles it).
"""

from __future__ import annotations

from typing import Any

from eth_abi.abi import encode as abi_encode
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from paddock_gateway.x402 import PERMIT2_ADDRESS, Permit2Authorization

SETTLE = keccak(text="settle(((address,uint256),uint256,uint256),address,(address,uint256),bytes)")[:4]
SETTLE_UPTO = keccak(
    text="settle(((address,uint256),uint256,uint256),uint256,address,(address,address,uint256),bytes)"
)[:4]
NONCE_BITMAP = keccak(text="nonceBitmap(address,uint256)")[:4]
ALLOWANCE = keccak(text="allowance(address,address)")[:4]

TYPES: dict[str, list[dict[str, str]]] = {
    "EIP712Domain": [
        {"name": "name", "type": "string"},
        {"name": "chainId", "type": "uint256"},
        {"name": "verifyingContract", "type": "address"},
    ],
    "PermitWitnessTransferFrom": [
        {"name": "permitted", "type": "TokenPermissions"},
        {"name": "spender", "type": "address"},
        {"name": "nonce", "type": "uint256"},
        {"name": "deadline", "type": "uint256"},
        {"name": "witness", "type": "Witness"},
    ],
    "TokenPermissions": [{"name": "token", "type": "address"}, {"name": "amount", "type": "uint256"}],
    "Witness": [{"name": "to", "type": "address"}, {"name": "validAfter", "type": "uint256"}],
}
UPTO_TYPES: dict[str, list[dict[str, str]]] = {
    **TYPES,
    "Witness": [
        {"name": "to", "type": "address"},
        {"name": "facilitator", "type": "address"},
        {"name": "validAfter", "type": "uint256"},
    ],
}


def typed_data(chain_id: int, auth: Permit2Authorization) -> dict[str, Any]:
    """The full EIP-712 message (for ``eth_account.messages.encode_typed_data(full_message=…)``)."""
    witness: dict[str, Any] = {"to": to_checksum_address(auth.to), "validAfter": auth.valid_after}
    if auth.facilitator is not None:
        witness = {
            "to": witness["to"],
            "facilitator": to_checksum_address(auth.facilitator),
            "validAfter": auth.valid_after,
        }
    return {
        "types": TYPES if auth.facilitator is None else UPTO_TYPES,
        "primaryType": "PermitWitnessTransferFrom",
        "domain": {"name": "Permit2", "chainId": chain_id, "verifyingContract": PERMIT2_ADDRESS},
        "message": {
            "permitted": {"token": to_checksum_address(auth.token), "amount": auth.value},
            "spender": to_checksum_address(auth.spender),
            "nonce": auth.nonce,
            "deadline": auth.deadline,
            "witness": witness,
        },
    }


def _word(address: str) -> bytes:
    return bytes.fromhex(address.lower().removeprefix("0x").rjust(64, "0"))


def nonce_bitmap_call(auth: Permit2Authorization) -> str:
    """``nonceBitmap(owner, nonce >> 8)`` on Permit2."""
    return "0x" + (NONCE_BITMAP + _word(auth.payer) + (auth.nonce >> 8).to_bytes(32, "big")).hex()


def nonce_used(bitmap_word: int, auth: Permit2Authorization) -> bool:
    return bool((bitmap_word >> (auth.nonce & 0xFF)) & 1)


def allowance_call(auth: Permit2Authorization) -> str:
    """``allowance(owner, Permit2)`` on the token."""
    return "0x" + (ALLOWANCE + _word(auth.payer) + _word(PERMIT2_ADDRESS)).hex()


def _signature(signature: bytes) -> bytes:
    sig = bytearray(signature)
    if len(sig) == 65 and sig[64] in (0, 1):  # some signers emit v as 0/1; Permit2's ecrecover wants 27/28
        sig[64] += 27
    return bytes(sig)


def settle_upto_calldata(auth: Permit2Authorization, amount: int, signature: bytes) -> str:
    """The upto proxy's ``settle(((token, max), nonce, deadline), amount, owner, (to, facilitator,
    validAfter), signature)``."""
    assert auth.facilitator is not None
    args = abi_encode(
        ["((address,uint256),uint256,uint256)", "uint256", "address", "(address,address,uint256)", "bytes"],
        [
            ((to_checksum_address(auth.token), auth.value), auth.nonce, auth.deadline),
            amount,
            to_checksum_address(auth.payer),
            (to_checksum_address(auth.to), to_checksum_address(auth.facilitator), auth.valid_after),
            _signature(signature),
        ],
    )
    return "0x" + (SETTLE_UPTO + args).hex()


def settle_calldata(auth: Permit2Authorization, signature: bytes) -> str:
    """The proxy's ``settle(((token, amount), nonce, deadline), owner, (to, validAfter), signature)``."""
    sig = _signature(signature)
    args = abi_encode(
        ["((address,uint256),uint256,uint256)", "address", "(address,uint256)", "bytes"],
        [
            ((to_checksum_address(auth.token), auth.value), auth.nonce, auth.deadline),
            to_checksum_address(auth.payer),
            (to_checksum_address(auth.to), auth.valid_after),
            bytes(sig),
        ],
    )
    return "0x" + (SETTLE + args).hex()

"""x402 ``exact`` payments, by EIP-3009 or by Permit2: verification, the single-use claim and settlement
on chain.

The gateway is its own facilitator (Appendix B.3), in this order:

1. ``check``: the signed payment answers one of this gateway's offers (scheme, network, asset and
   transfer method, payTo), ``from`` is the request's own wallet, the money goes to the recipient
   (``to``; for Permit2 ``witness.to``, with x402's proxy as the spender), ``value`` ≥ the price, the time
   window is open, and the EIP-712 signature recovers to ``from``. Nothing is read from a chain yet.
2. ``claim``: insert (network, nonce contract, payer, nonce); a duplicate is 409, so of any number of
   requests carrying one authorization exactly one goes on. The nonce contract is the one that makes
   the nonce single-use: the token for EIP-3009, Permit2 for Permit2 (whose nonces are the owner's across
   all tokens, so a Permit2 nonce taken for USDC cannot be taken again for USDT).
3. ``Settler.settle``: the nonce is unused on chain (``authorizationState``; Permit2's ``nonceBitmap``),
   for Permit2 the payer's allowance to Permit2 covers ``value``, the payer holds ``value``, a gas
   estimate of the settlement call (the token's ``transferWithAuthorization``; the proxy's ``settle``)
   from the settlement key succeeds (a full simulation), then the transaction is signed with that key,
   sent and its receipt awaited. The receipt must carry the token's ``Transfer`` of ``value`` from the
   payer to the recipient.

Any failure before a successful receipt releases the claim and credits nothing (a 402 names the x402
reason). Only a mined, successful settlement reaches the payment ledger and the top-up.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from eth_abi.abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from pydantic import SecretStr
from sqlalchemy import ColumnElement, and_, delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock import eip3009
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_gateway import permit2, signatures
from paddock_gateway.adapters.chain import CallReverted, ChainClient, ChainError, Receipt
from paddock_gateway.errors import PaymentAlreadyProcessed, PaymentVerificationFailed, UpstreamUnavailable
from paddock_gateway.models import X402Authorization
from paddock_gateway.registry import ChainSpec, Registry
from paddock_gateway.signatures import SignatureVerifier
from paddock_gateway.x402 import (
    PERMIT2,
    PERMIT2_ADDRESS,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    Authorization,
    Offer,
    Permit2Authorization,
    SignedPayment,
    offers,
    settlement_response,
)

log = get_logger("paddock.gateway.settlement")

#: x402's own reasons (coinbase/x402 ``mechanisms/evm/constants.py``), so x402 clients can match them.
INVALID_SCHEME = "unsupported_scheme"
NETWORK_MISMATCH = "network_mismatch"
ASSET_MISMATCH = "invalid_exact_evm_failed_to_get_asset_info"
RECIPIENT_MISMATCH = "invalid_exact_evm_payload_recipient_mismatch"
VALUE_MISMATCH = "invalid_exact_evm_payload_authorization_value_mismatch"
VALID_BEFORE = "invalid_exact_evm_payload_authorization_valid_before"
VALID_AFTER = "invalid_exact_evm_payload_authorization_valid_after"
INVALID_SIGNATURE = "invalid_exact_evm_payload_signature"
NONCE_USED = "invalid_exact_evm_nonce_already_used"
INSUFFICIENT_BALANCE = "invalid_exact_evm_insufficient_balance"
SIMULATION_FAILED = "invalid_exact_evm_transaction_simulation_failed"
TRANSACTION_FAILED = "transaction_failed"
#: x402's Permit2 reasons (the same constants module, and its settle-error mapping for a spent nonce).
PERMIT2_INVALID_SPENDER = "invalid_permit2_spender"
PERMIT2_RECIPIENT_MISMATCH = "invalid_permit2_recipient_mismatch"
PERMIT2_DEADLINE_EXPIRED = "permit2_deadline_expired"
PERMIT2_NOT_YET_VALID = "permit2_not_yet_valid"
PERMIT2_AMOUNT_MISMATCH = "permit2_amount_mismatch"
PERMIT2_TOKEN_MISMATCH = "permit2_token_mismatch"
PERMIT2_INVALID_SIGNATURE = "invalid_permit2_signature"
PERMIT2_ALLOWANCE_REQUIRED = "permit2_allowance_required"
PERMIT2_NONCE_USED = "permit2_invalid_nonce"
#: x402's reason for an ERC-6492 signature of a wallet that is not deployed (``ERR_UNDEPLOYED_SMART_WALLET``).
UNDEPLOYED_SMART_WALLET = "invalid_exact_evm_payload_undeployed_smart_wallet"
#: x402 has no reason for "signed by a wallet other than the caller's"; §7.2's own name for that rule.
SENDER_MISMATCH = "sender_mismatch"

#: validBefore must leave this much time for the settlement to be mined (the reference facilitator's 6 s).
VALID_BEFORE_MARGIN_S = 6
RECEIPT_TIMEOUT_S = 30.0
SETTLE_GAS_MARGIN = 1.25

TRANSFER_WITH_AUTHORIZATION = keccak(
    text="transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"
)[:4]
TRANSFER_WITH_AUTHORIZATION_BYTES = keccak(
    text="transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"
)[:4]
AUTHORIZATION_STATE = keccak(text="authorizationState(address,bytes32)")[:4]
BALANCE_OF = keccak(text="balanceOf(address)")[:4]
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()


def rejected(reason: str, payment: SignedPayment, required_raw: int) -> PaymentVerificationFailed:
    """The §7 402 ``payment_verification_failed`` with the x402 ``reason``, plus a failed
    ``PAYMENT-RESPONSE`` (x402 clients read the header, the gateway's own clients the body)."""
    error = PaymentVerificationFailed(
        reason=reason,
        network=payment.network,
        payer=payment.authorization.payer,
        required_amount_token=str(required_raw),
        authorized_amount_token=str(payment.authorization.value),
    )
    error.headers.update(
        settlement_response(
            success=False, network=payment.network, payer=payment.authorization.payer, error_reason=reason
        )
    )
    return error


def typed_data(offer: Offer, payment: SignedPayment) -> dict[str, Any]:
    """The EIP-712 message the payer signed: EIP-3009's ``TransferWithAuthorization`` or Permit2's
    ``PermitWitnessTransferFrom``."""
    auth = payment.authorization
    if isinstance(auth, Permit2Authorization):
        return permit2.typed_data(offer.chain.chain_id, auth)
    return eip3009.transfer_with_authorization(
        name=offer.domain_name,
        version=offer.domain_version,
        chain_id=offer.chain.chain_id,
        verifying_contract=offer.token.address,
        sender=to_checksum_address(auth.payer),
        to=to_checksum_address(auth.to),
        value=auth.value,
        valid_after=auth.valid_after,
        valid_before=auth.valid_before,
        nonce=bytes.fromhex(auth.nonce[2:]),
    )


def payment_digest(offer: Offer, payment: SignedPayment) -> bytes:
    """The EIP-712 digest, ``keccak256(0x1901 ‖ domainSeparator ‖ hashStruct(message))``: what an EOA
    signs and what a smart wallet's ``isValidSignature`` is asked about."""
    signable = encode_typed_data(full_message=typed_data(offer, payment))
    return keccak(b"\x19" + signable.version + signable.header + signable.body)


def recover_payer(offer: Offer, payment: SignedPayment) -> str | None:
    """The lowercase address whose key made the 65-byte signature (v of 0/1 read as 27/28), or None."""
    return signatures.recover(payment_digest(offer, payment), payment.signature)


async def check_signature(
    verifier: SignatureVerifier,
    client: ChainClient,
    offer: Offer,
    payment: SignedPayment,
    required_raw: int,
) -> SignedPayment:
    """The last check of step 1: the signature is ``from``'s. An EOA's recovers (ECDSA, no chain read);
    else ``from`` may be a smart wallet, asked on the offer's chain (EIP-1271; ERC-6492 for one not
    deployed yet). Returns the payment with the signature the wallet accepts (an ERC-6492 wrapper of a
    deployed wallet unwrapped), which is what the settlement sends.

    A counterfactual wallet whose signature is valid is still refused
    (``invalid_exact_evm_payload_undeployed_smart_wallet``): the gateway deploys no wallets (x402's
    facilitator calls no factory either unless it is allow-listed), and a wallet that does not exist has
    no balance to move and no allowance to Permit2."""
    auth = payment.authorization
    reason = PERMIT2_INVALID_SIGNATURE if isinstance(auth, Permit2Authorization) else INVALID_SIGNATURE
    if recover_payer(offer, payment) == auth.payer:
        return payment
    try:
        verdict = await verifier.verify(client, auth.payer, payment_digest(offer, payment), payment.signature)
    except ChainError as exc:
        raise UpstreamUnavailable(f"the {offer.chain.name} RPC is unavailable") from exc
    if not verdict.valid:
        raise rejected(reason, payment, required_raw)
    if not verdict.deployed:
        raise rejected(UNDEPLOYED_SMART_WALLET, payment, required_raw)
    log.info("x402_contract_signature", payer=auth.payer, scheme=verdict.scheme)
    return replace(payment, signature=verdict.signature)


def check(registry: Registry, payment: SignedPayment, wallet: str, required_raw: int, now_s: int) -> Offer:
    """Step 1 but the signature: everything that needs no chain and no database; returns the offer the
    payment answers. ``check_signature`` follows."""

    def failed(reason: str) -> PaymentVerificationFailed:
        return rejected(reason, payment, required_raw)

    if payment.scheme != "exact":
        raise failed(INVALID_SCHEME)
    on_network = [offer for offer in offers(registry) if offer.network == payment.network]
    if not on_network:
        raise failed(NETWORK_MISMATCH)
    offer = next(
        (o for o in on_network if o.method == payment.method and o.token.address.lower() == payment.asset),
        None,
    )
    if offer is None:
        raise failed(ASSET_MISMATCH)
    auth = payment.authorization
    if isinstance(auth, Permit2Authorization):
        return check_permit2(offer, payment, auth, wallet, required_raw, now_s, failed)
    recipient = offer.chain.recipient.lower()
    if payment.pay_to != recipient or auth.to != recipient:
        raise failed(RECIPIENT_MISMATCH)
    if auth.payer != wallet:
        raise failed(SENDER_MISMATCH)
    if auth.value < required_raw:
        raise failed(VALUE_MISMATCH)
    if auth.valid_before < now_s + VALID_BEFORE_MARGIN_S:
        raise failed(VALID_BEFORE)
    if auth.valid_after > now_s:
        raise failed(VALID_AFTER)
    return offer  # the signature is checked next, by ``check_signature`` (it may need the chain)


def check_permit2(
    offer: Offer,
    payment: SignedPayment,
    auth: Permit2Authorization,
    wallet: str,
    required_raw: int,
    now_s: int,
    failed: Callable[[str], PaymentVerificationFailed],
) -> Offer:
    """Step 1 for Permit2, in x402's verification order with the gateway's sender rule after the
    recipient, as for EIP-3009. ``amount`` ≥ the price: the proxy moves exactly ``amount``."""
    recipient = offer.chain.recipient.lower()
    if auth.spender != X402_EXACT_PERMIT2_PROXY_ADDRESS.lower():
        raise failed(PERMIT2_INVALID_SPENDER)
    if payment.pay_to != recipient or auth.to != recipient:
        raise failed(PERMIT2_RECIPIENT_MISMATCH)
    if auth.payer != wallet:
        raise failed(SENDER_MISMATCH)
    if auth.deadline < now_s + VALID_BEFORE_MARGIN_S:
        raise failed(PERMIT2_DEADLINE_EXPIRED)
    if auth.valid_after > now_s:
        raise failed(PERMIT2_NOT_YET_VALID)
    if auth.value < required_raw:
        raise failed(PERMIT2_AMOUNT_MISMATCH)
    if auth.token != offer.token.address.lower():
        raise failed(PERMIT2_TOKEN_MISMATCH)
    return offer


@dataclass(frozen=True)
class Claim:
    network: str
    asset: str
    payer: str
    nonce: str
    #: Set when this request took over a settlement an earlier one sent but did not see mined.
    submitted_tx: str | None = None


def claim_of(payment: SignedPayment) -> Claim:
    """The claim's key: ``asset`` holds the contract whose nonce it is (the token; Permit2)."""
    auth = payment.authorization
    holder = PERMIT2_ADDRESS.lower() if payment.method == PERMIT2 else payment.asset
    return Claim(network=payment.network, asset=holder, payer=auth.payer, nonce=auth.nonce_key)


def where(claim: Claim) -> ColumnElement[bool]:
    return and_(
        X402Authorization.network == claim.network,
        X402Authorization.asset == claim.asset,
        X402Authorization.payer == claim.payer,
        X402Authorization.nonce == claim.nonce,
    )


async def claim(
    sessions: async_sessionmaker[AsyncSession], payment: SignedPayment, now: dt.datetime
) -> Claim:
    """Step 2: take the authorization on; 409 if any request (this one's twin or an earlier one) has."""
    taken = claim_of(payment)
    try:
        async with transaction(sessions) as session:
            session.add(
                X402Authorization(
                    network=taken.network,
                    asset=taken.asset,
                    payer=taken.payer,
                    nonce=taken.nonce,
                    state="settling",
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError as exc:
        existing = await find(sessions, taken)
        if existing is not None and existing.state == "submitted" and existing.tx_hash:
            # An earlier request sent the settlement and gave up waiting (502): whoever moves the row
            # out of "submitted" first waits for that same transaction; nothing is sent again.
            async with transaction(sessions) as session:
                result = await session.execute(
                    update(X402Authorization)
                    .where(where(taken), X402Authorization.state == "submitted")
                    .values(state="settling", updated_at=now)
                )
            if getattr(result, "rowcount", 0) == 1:
                return replace(taken, submitted_tx=existing.tx_hash)
        raise PaymentAlreadyProcessed(tx_hash=existing.tx_hash if existing else None) from exc
    return taken


async def find(sessions: async_sessionmaker[AsyncSession], taken: Claim) -> X402Authorization | None:
    async with sessions() as session:
        return await session.get(X402Authorization, (taken.network, taken.asset, taken.payer, taken.nonce))


async def release(sessions: async_sessionmaker[AsyncSession], taken: Claim) -> None:
    """Nothing moved on chain: forget the claim, so the same authorization may be tried again."""
    async with transaction(sessions) as session:
        await session.execute(delete(X402Authorization).where(where(taken)))


async def mark(
    sessions: async_sessionmaker[AsyncSession], taken: Claim, state: str, tx_hash: str, now: dt.datetime
) -> None:
    async with transaction(sessions) as session:
        await session.execute(
            update(X402Authorization).where(where(taken)).values(state=state, tx_hash=tx_hash, updated_at=now)
        )


def _address_word(address: str) -> bytes:
    return bytes.fromhex(address.lower().removeprefix("0x").rjust(64, "0"))


def settle_calldata(auth: Authorization, sig: bytes) -> str:
    """``transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s)``; for a
    signature that is not 65 bytes (a smart wallet's), the form that takes ``bytes signature`` (USDC
    v2.2's, which checks it with EIP-1271)."""
    if len(sig) != 65:
        args = abi_encode(
            ["address", "address", "uint256", "uint256", "uint256", "bytes32", "bytes"],
            [
                to_checksum_address(auth.payer),
                to_checksum_address(auth.to),
                auth.value,
                auth.valid_after,
                auth.valid_before,
                bytes.fromhex(auth.nonce[2:]),
                sig,
            ],
        )
        return "0x" + (TRANSFER_WITH_AUTHORIZATION_BYTES + args).hex()
    v = sig[64] + 27 if sig[64] in (0, 1) else sig[64]
    args = abi_encode(
        ["address", "address", "uint256", "uint256", "uint256", "bytes32", "uint8", "bytes32", "bytes32"],
        [
            to_checksum_address(auth.payer),
            to_checksum_address(auth.to),
            auth.value,
            auth.valid_after,
            auth.valid_before,
            bytes.fromhex(auth.nonce[2:]),
            v,
            sig[:32],
            sig[32:64],
        ],
    )
    return "0x" + (TRANSFER_WITH_AUTHORIZATION + args).hex()


def _word_value(result: bytes) -> int:
    return int.from_bytes(result or b"\0", "big")


@dataclass(frozen=True)
class Precheck:
    """One read before settling: ``eth_call(contract, data)``; ``fails(word)`` means ``reason``."""

    contract: str
    data: str
    fails: Callable[[int], bool]
    reason: str


@dataclass(frozen=True)
class SettlementCall:
    """What settling a payment sends (``data`` to ``to``) and what must hold on chain first, in the order
    x402 reports failures."""

    to: str
    data: str
    prechecks: tuple[Precheck, ...]


def settlement_call(offer: Offer, payment: SignedPayment) -> SettlementCall:
    auth, token = payment.authorization, offer.token.address
    balance = Precheck(
        token,
        "0x" + (BALANCE_OF + _address_word(auth.payer)).hex(),
        lambda held: held < auth.value,
        INSUFFICIENT_BALANCE,
    )
    if isinstance(auth, Permit2Authorization):
        return SettlementCall(
            to=X402_EXACT_PERMIT2_PROXY_ADDRESS,
            data=permit2.settle_calldata(auth, payment.signature),
            prechecks=(
                Precheck(
                    PERMIT2_ADDRESS,
                    permit2.nonce_bitmap_call(auth),
                    lambda word: permit2.nonce_used(word, auth),
                    PERMIT2_NONCE_USED,
                ),
                Precheck(
                    token,
                    permit2.allowance_call(auth),
                    lambda allowed: allowed < auth.value,
                    PERMIT2_ALLOWANCE_REQUIRED,
                ),
                balance,
            ),
        )
    assert isinstance(auth, Authorization)
    state = "0x" + (AUTHORIZATION_STATE + _address_word(auth.payer)).hex() + auth.nonce[2:]
    return SettlementCall(
        to=token,
        data=settle_calldata(auth, payment.signature),
        prechecks=(Precheck(token, state, lambda used: used != 0, NONCE_USED), balance),
    )


def moved(receipt: Receipt, offer: Offer, payment: SignedPayment) -> bool:
    """Whether the receipt carries the token's ``Transfer`` of ``value`` from the payer to the recipient:
    a call that succeeds without moving the money (no contract at the proxy's address, say) pays nothing."""
    auth = payment.authorization
    topics = (TRANSFER_TOPIC, "0x" + _address_word(auth.payer).hex(), "0x" + _address_word(auth.to).hex())
    return any(
        log.address == offer.token.address.lower()
        and log.topics[:3] == topics
        and not log.removed
        and _word_value(bytes.fromhex(log.data[2:])) == auth.value
        for log in receipt.logs
    )


class Settler:
    """Submits settlements from the gateway's own key, which pays their gas.

    The key is held as a ``SecretStr`` and used only to sign; it never enters a log line, an error or
    a response. Transactions from one key must carry consecutive nonces, so signing and sending are
    serialised per chain; waiting for receipts is not.
    """

    def __init__(self, private_key: SecretStr, *, receipt_timeout_s: float = RECEIPT_TIMEOUT_S) -> None:
        self._key = private_key
        self.address = (
            str(Account.from_key(private_key.get_secret_value()).address) if self.configured else ""
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self.receipt_timeout_s = receipt_timeout_s

    @property
    def configured(self) -> bool:
        return bool(self._key.get_secret_value())

    async def settle(
        self, client: ChainClient, offer: Offer, payment: SignedPayment, required_raw: int
    ) -> str:
        """Step 3: returns the hash of a mined, successful settlement, or raises (nothing moved)."""

        def failed(reason: str) -> PaymentVerificationFailed:
            return rejected(reason, payment, required_raw)

        call = settlement_call(offer, payment)
        tx_hash = await self.send(client, offer.chain, call, failed, payment.authorization.payer)
        return await self.await_settlement(client, offer, payment, required_raw, tx_hash)

    async def prepare(
        self,
        client: ChainClient,
        chain: ChainSpec,
        call: SettlementCall,
        failed: Callable[[str], Exception],
        payer: str,
    ) -> tuple[int, int]:
        """What must hold before ``call`` is sent: the RPC is ``chain``'s, every precheck passes, and a gas
        estimate from the settlement key succeeds (a full simulation). Returns (gas, gas price); raises
        ``failed(reason)`` in the order x402 reports failures, 502 when the RPC is unavailable."""
        try:
            if await client.chain_id() != chain.chain_id:
                raise UpstreamUnavailable(f"the RPC for {chain.name} is not chain {chain.chain_id}")
            # Independent reads, in one round trip's time; judged in the order x402 reports them.
            results: list[Any] = await asyncio.gather(
                *(client.call(check.contract, check.data) for check in call.prechecks),
                client.estimate_gas(self.address, call.to, call.data),
                client.gas_price(),
                return_exceptions=True,
            )
            *reads, gas, gas_price = results
            for result in (*reads, gas_price):
                if isinstance(result, BaseException):
                    raise result
            for check, result in zip(call.prechecks, reads, strict=True):
                if check.fails(_word_value(cast(bytes, result))):
                    raise failed(check.reason)
            if isinstance(gas, CallReverted):
                log.info("x402_simulation_reverted", payer=payer, reason=str(gas))
                raise failed(SIMULATION_FAILED) from gas
            if isinstance(gas, BaseException):
                raise gas
        except CallReverted as exc:  # a read reverted: not a token this gateway can settle
            raise failed(SIMULATION_FAILED) from exc
        except ChainError as exc:
            raise UpstreamUnavailable(f"the {chain.name} RPC is unavailable") from exc
        return int(gas), int(gas_price)

    async def send(
        self,
        client: ChainClient,
        chain: ChainSpec,
        call: SettlementCall,
        failed: Callable[[str], Exception],
        payer: str,
    ) -> str:
        """``prepare``, then sign and send ``call`` from the settlement key; returns the hash of the sent
        transaction (not yet mined). Raises ``failed(reason)`` for a precheck or simulation that fails, 502
        when the RPC is unavailable: nothing was sent."""
        gas, gas_price = await self.prepare(client, chain, call, failed, payer)
        try:
            lock = self._locks.setdefault(chain.name, asyncio.Lock())
            async with lock:  # one key's nonces must be consecutive: take one and send, one at a time
                tx = {
                    "chainId": chain.chain_id,
                    "nonce": await client.pending_nonce(self.address),
                    "to": to_checksum_address(call.to),
                    "data": call.data,
                    "value": 0,
                    "gas": int(gas * SETTLE_GAS_MARGIN),
                    "gasPrice": gas_price,
                }
                signed = Account.sign_transaction(tx, self._key.get_secret_value())
                try:
                    tx_hash = await client.send_raw_transaction(bytes(signed.raw_transaction))
                except ChainError as exc:  # e.g. the settlement key is out of gas: nothing was sent
                    log.warning("x402_settlement_refused", chain=chain.name, error=str(exc))
                    raise UpstreamUnavailable(
                        f"the {chain.name} RPC did not accept the settlement transaction"
                    ) from exc
        except CallReverted as exc:  # a read reverted: not a token this gateway can settle
            raise failed(SIMULATION_FAILED) from exc
        except ChainError as exc:
            raise UpstreamUnavailable(f"the {chain.name} RPC is unavailable") from exc
        return tx_hash

    async def await_settlement(
        self, client: ChainClient, offer: Offer, payment: SignedPayment, required_raw: int, tx_hash: str
    ) -> str:
        """The receipt of a sent settlement: its hash once mined successfully, 402 if it reverted, 502
        (naming the hash) if it is not mined within ``receipt_timeout_s``."""
        try:
            receipt = await self.receipt(client, tx_hash)
        except ChainError:
            receipt = None  # unknown, as with a timeout: the transaction may still land
        if receipt is None:
            # Sent but not mined in time: it may still land. The hash is a real Transfer from the payer,
            # so resubmitting it as X-Payment-Tx credits it once it is mined (the ledger is shared).
            raise UpstreamUnavailable(
                "settlement sent but not yet mined; resubmit tx_hash as X-Payment-Tx", tx_hash=tx_hash
            )
        if receipt.status != 1 or not moved(receipt, offer, payment):
            raise rejected(TRANSACTION_FAILED, payment, required_raw)
        return tx_hash

    async def receipt(self, client: ChainClient, tx_hash: str) -> Receipt | None:
        """The receipt once mined, or None after ``receipt_timeout_s``."""
        deadline = time.monotonic() + self.receipt_timeout_s
        delay = 0.02
        while True:
            receipt = await client.get_receipt(tx_hash)
            if receipt is not None:
                return receipt
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

"""Smart wallets against real anvil chains: a minimal EIP-1271 wallet (``devchain/contracts/SmartWallet.sol``,
one owner EOA) deployed by its CREATE2 factory authenticates with the gateway's wallet headers and pays a
deploy by Permit2 through coinbase's ``x402`` client; a counterfactual wallet (not deployed) is
authenticated by an ERC-6492 signature, checked by simulating the factory call and ``isValidSignature`` in
one ``eth_call``, and deploys nothing; a signature by another key than the owner's is refused (401 / 402
with the reason) and credits nothing."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_abi.abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from paddock_gateway import credits, devchain, signatures
from paddock_gateway.adapters.chain import ChainClient, ChainError
from paddock_gateway.auth import eip191_digest
from tests.gateway.conftest import RECIPIENT, Chain, Clock, Gateway, Wallet, rpc, static_site, unique_name
from tests.gateway.test_siwx import proof as siwx_proof
from tests.gateway.test_x402 import PRICE_RAW, decode, encode
from tests.gateway.test_x402_permit2 import sign_permit, word
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]

BUILD = devchain.REPO_DEVCHAIN_DIR / "build"
CREATE_ACCOUNT = keccak(text="createAccount(address,uint256)")[:4]
GET_ADDRESS = keccak(text="getAddress(address,uint256)")[:4]
EXECUTE = keccak(text="execute(address,uint256,bytes)")[:4]
APPROVE = keccak(text="approve(address,uint256)")[:4]


def creation_code(name: str) -> str:
    return str(json.loads((BUILD / f"{name}.json").read_text())["bytecode"])


async def deploy_factory(chain: Chain) -> str:
    tx = await rpc(
        chain.rpc_url,
        "eth_sendTransaction",
        [{"from": devchain.DEMO_ADDRESS, "data": creation_code("SmartWalletFactory")}],
    )
    receipt = await chain.mined(tx)
    assert receipt["status"] == "0x1"
    return str(receipt["contractAddress"])


class SmartWallet:
    """A SmartWallet at its CREATE2 address for (owner, salt): maybe deployed, maybe only counterfactual."""

    def __init__(self, chain: Chain, factory: str, owner: LocalAccount, address: str, salt: int) -> None:
        self.chain, self.factory, self.owner, self.address, self.salt = chain, factory, owner, address, salt

    @classmethod
    async def at(cls, chain: Chain, factory: str, owner: LocalAccount | None = None) -> SmartWallet:
        owner = owner or Account.create()
        salt = int.from_bytes(uuid.uuid4().bytes, "big")
        args = abi_encode(["address", "uint256"], [owner.address, salt])
        answer = await rpc(
            chain.rpc_url, "eth_call", [{"to": factory, "data": "0x" + (GET_ADDRESS + args).hex()}]
        )
        return cls(chain, factory, owner, to_checksum_address("0x" + answer[-40:]), salt)

    @property
    def create_calldata(self) -> bytes:
        return CREATE_ACCOUNT + abi_encode(["address", "uint256"], [self.owner.address, self.salt])

    async def code(self) -> str:
        return str(await rpc(self.chain.rpc_url, "eth_getCode", [self.address, "latest"]))

    async def deploy(self) -> None:
        tx = await rpc(
            self.chain.rpc_url,
            "eth_sendTransaction",
            [{"from": devchain.DEMO_ADDRESS, "to": self.factory, "data": "0x" + self.create_calldata.hex()}],
        )
        assert (await self.chain.mined(tx))["status"] == "0x1"
        assert await self.code() != "0x"

    async def fund_and_approve_permit2(self, token: str) -> None:
        """Tokens for the wallet, gas for its owner, and the wallet's one transaction before paying by
        Permit2 (``approve(Permit2, max)``), sent by the owner through ``execute``."""
        devchain.mint(self.chain.rpc_url, self.chain.tokens[token], self.address, 100 * 10**6)
        await rpc(self.chain.rpc_url, "anvil_setBalance", [self.owner.address, hex(10**19)])
        approve = APPROVE + bytes.fromhex(word(PERMIT2_ADDRESS) + word(2**256 - 1))
        call = EXECUTE + abi_encode(["address", "uint256", "bytes"], [self.chain.tokens[token], 0, approve])
        tx = await Wallet(self.owner).send(self.chain, self.address, "0x" + call.hex(), gas=200_000)
        assert (await self.chain.mined(tx))["status"] == "0x1"

    def sign_digest(self, digest: bytes, *, key: LocalAccount | None = None) -> bytes:
        """What the wallet's ``isValidSignature`` accepts: the owner's ECDSA signature over the hash."""
        return bytes((key or self.owner).unsafe_sign_hash(digest).signature)

    def auth(self, now_ms: int, *, key: LocalAccount | None = None, erc6492: bool = False) -> dict[str, str]:
        """The gateway's wallet headers for this wallet: EIP-191 over ``address:timestamp:nonce``, signed
        by the owner (or ``key``), ERC-6492-wrapped with the factory call for a wallet not deployed."""
        nonce, timestamp = str(uuid.uuid4()), str(now_ms)
        message = f"{self.address}:{timestamp}:{nonce}"
        signature = bytes((key or self.owner).sign_message(encode_defunct(text=message)).signature)
        if erc6492:
            signature = signatures.wrap_erc6492(self.factory, self.create_calldata, signature)
        return {
            "X-Wallet-Address": self.address,
            "X-Signature": "0x" + signature.hex(),
            "X-Timestamp": timestamp,
            "X-Nonce": nonce,
        }


class SmartWalletSigner:
    """An x402 ``ClientEvmSigner`` for the smart wallet: its address, the owner's EIP-712 signature (the
    same digest; the wallet's ``isValidSignature`` recovers the owner from it)."""

    def __init__(self, wallet: SmartWallet) -> None:
        self.wallet = wallet
        self.owner = EthAccountSigner(wallet.owner)

    @property
    def address(self) -> str:
        return self.wallet.address

    def sign_typed_data(self, domain: Any, types: Any, primary_type: str, message: dict[str, Any]) -> bytes:
        return bytes(self.owner.sign_typed_data(domain, types, primary_type, message))


class SmartWalletAuth(httpx.AsyncBaseTransport):
    """Fresh smart-wallet auth headers on every request (the x402 transport replays headers)."""

    def __init__(self, wallet: SmartWallet, clock: Clock) -> None:
        self.wallet, self.clock = wallet, clock
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers.update(self.wallet.auth(self.clock.now_ms()))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def credits_of(gw: Gateway, address: str) -> int:
    async with gw.services.sessions() as session:
        return await credits.balance_micro(session, address.lower())


async def test_a_smart_wallet_authenticates_and_pays_a_deploy_by_permit2(
    x402_gateway: Gateway, devchains: dict[str, Chain]
) -> None:
    gw, chain = x402_gateway, devchains["base"]
    wallet = await SmartWallet.at(chain, await deploy_factory(chain))
    await wallet.deploy()
    await wallet.fund_and_approve_permit2("usdc")

    listed = await gw.http.get("/agent/projects", headers=wallet.auth(gw.clock.now_ms()))
    assert listed.status_code == 200, listed.text  # EIP-1271 wallet auth, no EOA signed for this address
    assert listed.json()["projects"] == []

    network, asset = f"eip155:{chain.chain_id}", chain.tokens["usdc"]
    client = x402Client().set_spend_controls({"max_amount_per_payment": "$5"})
    register_exact_evm_client(client, SmartWalletSigner(wallet), networks=network)
    client.register_policy(
        lambda version, offers: [
            o
            for o in offers
            if o.asset.lower() == asset.lower()
            and (o.get_extra() or {}).get("assetTransferMethod") == "permit2"
        ]
    )
    recipient_before = await chain.token_balance("usdc", RECIPIENT)
    body = static_site(unique_name("sw"), "<h1>paid by a smart wallet</h1>", port=free_port())
    transport = x402AsyncTransport(client, transport=SmartWalletAuth(wallet, gw.clock))
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        response = await http.post("/agent/deploy", json=body)

    assert response.status_code == 200, response.text
    settled = decode(response.headers["PAYMENT-RESPONSE"])
    assert settled["success"] is True and settled["payer"] == wallet.address
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW
    assert await chain.token_balance("usdc", wallet.address) == 100 * 10**6 - PRICE_RAW
    assert await credits_of(gw, wallet.address) == PRICE_RAW * 100
    projects = (await gw.http.get("/agent/projects", headers=wallet.auth(gw.clock.now_ms()))).json()[
        "projects"
    ]
    assert [p["id"] for p in projects] == [response.json()["projectId"]]
    # Sign-in-with-x as the smart wallet: the owner signs the EIP-4361 message, EIP-1271 accepts it.
    header = await siwx_proof(gw, wallet.owner, address=wallet.address)
    by_siwx = await gw.http.get("/agent/projects", headers={"SIGN-IN-WITH-X": header})
    assert by_siwx.status_code == 200, by_siwx.text
    assert [p["id"] for p in by_siwx.json()["projects"]] == [response.json()["projectId"]]


async def test_a_counterfactual_wallet_is_authenticated_by_erc6492_and_nothing_is_deployed(
    x402_gateway: Gateway, devchains: dict[str, Chain]
) -> None:
    gw, chain = x402_gateway, devchains["base"]
    wallet = await SmartWallet.at(chain, await deploy_factory(chain))
    assert await wallet.code() == "0x"

    response = await gw.http.get("/agent/projects", headers=wallet.auth(gw.clock.now_ms(), erc6492=True))
    assert response.status_code == 200, response.text
    assert response.json()["projects"] == []
    assert await wallet.code() == "0x"  # the factory call ran inside an eth_call only

    stranger = Account.create()
    forged = await gw.http.get(
        "/agent/projects", headers=wallet.auth(gw.clock.now_ms(), key=stranger, erc6492=True)
    )
    assert forged.status_code == 401
    assert forged.json() == {
        "error": "Invalid signature",
        "code": "auth_invalid_signature",
        "reason": "eip6492_signature_rejected",
    }
    # Unwrapped, the owner's signature is not the (codeless) address's own: an EOA mismatch, no reason.
    plain = await gw.http.get("/agent/projects", headers=wallet.auth(gw.clock.now_ms()))
    assert plain.json() == {"error": "Invalid signature", "code": "auth_invalid_signature"}


async def test_another_key_than_the_owners_is_refused_and_credits_nothing(
    x402_gateway: Gateway, devchains: dict[str, Chain]
) -> None:
    gw, chain = x402_gateway, devchains["base"]
    factory = await deploy_factory(chain)
    wallet = await SmartWallet.at(chain, factory)
    await wallet.deploy()
    await wallet.fund_and_approve_permit2("usdt")
    stranger = Account.create()

    refused = await gw.http.get("/agent/projects", headers=wallet.auth(gw.clock.now_ms(), key=stranger))
    assert refused.status_code == 401
    assert refused.json()["reason"] == "eip1271_signature_rejected"

    body = static_site(unique_name("sw"), "x", port=free_port())
    quote = await gw.http.post("/agent/deploy", json=body, headers=wallet.auth(gw.clock.now_ms()))
    assert quote.status_code == 402
    offer = next(
        o
        for o in decode(quote.headers["PAYMENT-REQUIRED"])["accepts"]
        if o["asset"] == chain.tokens["usdt"] and o["network"] == f"eip155:{chain.chain_id}"
    )
    payer = Wallet(wallet.owner)
    payload = sign_permit(payer, offer, chain.chain_id, signer=Wallet(stranger))
    payload["payload"]["permit2Authorization"]["from"] = wallet.address
    recipient_before = await chain.token_balance("usdt", RECIPIENT)
    paid = await gw.http.post(
        "/agent/deploy",
        json=body,
        headers={**wallet.auth(gw.clock.now_ms()), "PAYMENT-SIGNATURE": encode(payload)},
    )
    assert paid.status_code == 402, paid.text
    assert paid.json()["reason"] == "invalid_permit2_signature"
    assert decode(paid.headers["PAYMENT-RESPONSE"])["errorReason"] == "invalid_permit2_signature"

    # A counterfactual wallet's valid ERC-6492 payment: refused, the gateway deploys no wallets.
    ghost = await SmartWallet.at(chain, factory)
    ghost_payload = sign_permit(Wallet(ghost.owner), offer, chain.chain_id)
    ghost_payload["payload"]["permit2Authorization"]["from"] = ghost.address
    inner = bytes.fromhex(ghost_payload["payload"]["signature"][2:])
    wrapped = signatures.wrap_erc6492(factory, ghost.create_calldata, inner)
    ghost_payload["payload"]["signature"] = "0x" + wrapped.hex()
    ghost_paid = await gw.http.post(
        "/agent/deploy",
        json=body,
        headers={**ghost.auth(gw.clock.now_ms(), erc6492=True), "PAYMENT-SIGNATURE": encode(ghost_payload)},
    )
    assert ghost_paid.status_code == 402, ghost_paid.text
    assert ghost_paid.json()["reason"] == "invalid_exact_evm_payload_undeployed_smart_wallet"
    assert await ghost.code() == "0x"

    assert await chain.token_balance("usdt", RECIPIENT) == recipient_before
    assert await credits_of(gw, wallet.address) == 0 and await credits_of(gw, ghost.address) == 0
    assert (await gw.http.get("/agent/projects", headers=wallet.auth(gw.clock.now_ms()))).json()[
        "projects"
    ] == []


async def test_answers_are_cached_briefly_per_signature(
    devchains: dict[str, Chain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict is kept ``ttl_s``: a wallet whose code is removed still passes from the cache, then
    fails once the answer has expired. Another signature over the same hash is asked afresh. The
    verifier's clock is the test's, so a slow chain call on a loaded machine cannot expire the answer
    early (a 1 s wall-clock TTL did, at load 30)."""
    now = [1000.0]
    monkeypatch.setattr(signatures, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    chain = devchains["arbitrum"]
    wallet = await SmartWallet.at(chain, await deploy_factory(chain))
    await wallet.deploy()
    digest = eip191_digest("hello")
    verifier = signatures.SignatureVerifier(timeout_s=5, ttl_s=1.0)
    client = ChainClient(chain.rpc_url)
    try:
        first = await verifier.verify(client, wallet.address, digest, wallet.sign_digest(digest))
        assert (first.valid, first.scheme, first.deployed) == (True, "eip1271", True)
        stranger = await verifier.verify(
            client, wallet.address, digest, wallet.sign_digest(digest, key=Account.create())
        )
        assert stranger.valid is False
        await rpc(chain.rpc_url, "anvil_setCode", [wallet.address, "0x"])
        assert (
            await verifier.verify(client, wallet.address, digest, wallet.sign_digest(digest))
        ).valid is True
        now[0] += 1.1
        gone = await verifier.verify(client, wallet.address, digest, wallet.sign_digest(digest))
        assert (gone.valid, gone.deployed) == (False, False)
    finally:
        await client.aclose()


async def test_a_chain_that_does_not_answer_is_bounded_by_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        client = ChainClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=60)
        verifier = signatures.SignatureVerifier(timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(ChainError, match=r"no answer within 0\.5s"):
            await verifier.verify(client, "0x" + "11" * 20, b"\0" * 32, b"\1" * 65)
        assert time.monotonic() - started < 3
        await client.aclose()


def test_the_packaged_validator_is_the_devchain_build() -> None:
    """The gateway runs ``sig_validator.json``'s creation code; it must be what ``node build-token.js``
    compiled from ``devchain/contracts/UniversalSigValidator.sol``."""
    packaged = json.loads(Path(signatures.VALIDATOR_ARTIFACT).read_text())
    built = json.loads((BUILD / "ValidateSigOffchain.json").read_text())
    assert packaged["bytecode"] == built["bytecode"] and len(built["bytecode"]) > 100

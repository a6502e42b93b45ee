"""``GatewayClient``: deploy a project through the pay-per-deploy gateway (``/agent/…``), paying with an
ERC-20 transfer or, with ``pay_with="x402"``, an x402 v2 signature that the gateway settles (no gas,
no RPC, no transaction of the wallet's own but Permit2's one ``approve`` per token), and rent sandboxes
paid by the wallet alone. Needs the ``wallet`` extra (``pip install
paddock[wallet]``: eth-account, web3).

    from paddock import GatewayClient

    gateway = GatewayClient("http://127.0.0.1:8082", private_key, rpc_urls={"base": "http://…"})
    deployment = gateway.deploy("./site", unique_name="my-site", settings={"port": 8000})
    print(deployment.url)

Every request is signed (EIP-191 over ``address:timestamp_ms:nonce``, fresh each time). ``deploy``
asks for a quote (402), checks the token balance, sends the transfer with web3, submits its hash and
polls until ``ready`` or ``failed``. It never pays twice: the signed transfer is recorded before it is
broadcast (:mod:`paddock._payments`) and every later attempt — after a 500, a lost answer, a crash —
resubmits that hash; 409 and ``deploy_failed_after_topup`` go on with the credits already bought.

With x402 the wallet signs the offer of the quote's ``PAYMENT-REQUIRED`` header that matches the caller's
preference (:mod:`paddock.x402`: USDC or USDT, ``exact`` or ``upto``, by EIP-3009 or Permit2) and every
retry within the call sends that same signature: the gateway settles an authorization once at most (409
afterwards), so a lost answer never pays twice. Nothing needs to survive a crash: an unsettled
authorization moves nothing and expires, and a settled one left credits on the gateway that the next
deploy uses. ``create_wallet_sandbox`` pays ``POST /agent/sandboxes`` the same way and returns a
``WalletSandbox`` whose access token drives the sandbox through the control plane.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from paddock import _base, permit2, x402
from paddock._errors import (
    APIError,
    DeploymentFailedError,
    InsufficientFundsError,
    PaymentError,
    PaymentVerificationError,
    TransportError,
    WaitTimeoutError,
)
from paddock._models import (
    Chain,
    DeploymentStatus,
    Project,
    ProjectDeleted,
    Recipients,
    WalletBalance,
)
from paddock._payments import Payment, PaymentLedger
from paddock.wallet_sandbox import WalletSandbox

try:
    from eth_account import Account
    from eth_account.messages import encode_defunct
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("GatewayClient needs the wallet extra: pip install 'paddock[wallet]'") from exc

ENV_GATEWAY_URL = "PADDOCK_GATEWAY_URL"
ENV_WALLET_KEY = "PADDOCK_WALLET_KEY"
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8082"
SKIPPED_DIRS = frozenset({".git", "node_modules", ".venv", "__pycache__"})
#: Verification reasons that mean "not yet": the same hash is submitted again a little later.
NOT_YET = frozenset({"tx_pending", "insufficient_confirmations", "tx_not_found"})
#: x402 v2 headers and the reason the gateway gives when the payer holds too little.
PAYMENT_REQUIRED = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE = "PAYMENT-RESPONSE"
X402_INSUFFICIENT = "invalid_exact_evm_insufficient_balance"
X402_ALLOWANCE = "permit2_allowance_required"
WALLET_SANDBOXES = "/agent/sandboxes"
ALLOWANCE_HINT = (
    "the wallet's allowance to Permit2 (0x000000000022D473030F116dDEE9F6B43aC78BA3) is short: approve it "
    "once for this token (GatewayClient.approve_permit2, or give rpc_urls for the chain and the client "
    "approves when short)"
)
ERC20_ABI = [
    {
        "name": "transfer",
        "type": "function",
        "stateMutability": "nonpayable",
        "inputs": [{"name": "to", "type": "address"}, {"name": "value", "type": "uint256"}],
        "outputs": [{"name": "", "type": "bool"}],
    },
    {
        "name": "balanceOf",
        "type": "function",
        "stateMutability": "view",
        "inputs": [{"name": "owner", "type": "address"}],
        "outputs": [{"name": "", "type": "uint256"}],
    },
]

#: ``on_progress(stage, detail)`` stages, in order: upload, quote, payment, confirmation, build, ready.
Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class Deployment:
    project_id: str
    deployment_id: str | None
    status: str  # deploying, ready, failed
    url: str | None = None
    tx_hash: str | None = None  # the transfer or x402 settlement; None when it ran on credits already held
    amount_usd: float | None = None
    last_status: dict[str, Any] = field(default_factory=dict)


def upload_of(source: str | os.PathLike[str] | Mapping[str, bytes | str]) -> dict[str, Any]:
    """The ``upload`` object: a directory (every regular file; VCS and dependency dirs skipped), a
    ``.zip`` file, or a mapping of relative path to content."""
    if isinstance(source, Mapping):
        files = [
            {"path": name, "content": _b64(data.encode() if isinstance(data, str) else data)}
            for name, data in source.items()
        ]
        return {"type": "files", "files": files}
    path = Path(source)
    if path.is_file() and path.suffix == ".zip":
        return {"type": "zip", "data": _b64(path.read_bytes()), "filename": path.name}
    if not path.is_dir():
        raise ValueError(f"{path} is neither a directory nor a .zip file")
    files = []
    for item in sorted(path.rglob("*")):
        relative = item.relative_to(path)
        if any(part in SKIPPED_DIRS for part in relative.parts) or item.is_symlink() or not item.is_file():
            continue
        files.append({"path": relative.as_posix(), "content": _b64(item.read_bytes())})
    if not files:
        raise ValueError(f"{path} has no files to upload")
    return {"type": "files", "files": files}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class GatewayClient:
    """A wallet's client for the gateway. ``rpc_urls`` maps chain names (``base``, ``arbitrum``) to the
    JSON-RPC endpoints used to pay (also ``PADDOCK_RPC_URL_BASE`` / ``PADDOCK_RPC_URL_ARBITRUM``)."""

    def __init__(
        self,
        base_url: str | None = None,
        private_key: str | None = None,
        *,
        rpc_urls: Mapping[str, str] | None = None,
        payments_file: str | os.PathLike[str] | None = None,
        timeout: float = 120.0,
        poll_interval_s: float = 5.0,
        max_submits: int = 6,
        transport: httpx.BaseTransport | None = None,
        auto_approve_permit2: bool = True,
    ) -> None:
        key = private_key or os.environ.get(ENV_WALLET_KEY)
        if not key:
            raise ValueError(f"a wallet private key is required (argument or {ENV_WALLET_KEY})")
        self.account = Account.from_key(key)
        url = (base_url or os.environ.get(ENV_GATEWAY_URL) or DEFAULT_GATEWAY_URL).rstrip("/")
        self.base_url = url
        self.rpc_urls = {
            name: os.environ[f"PADDOCK_RPC_URL_{name.upper()}"]
            for name in ("base", "arbitrum")
            if os.environ.get(f"PADDOCK_RPC_URL_{name.upper()}")
        }
        self.rpc_urls.update(rpc_urls or {})
        self.ledger = PaymentLedger(payments_file)
        self.poll_interval_s = poll_interval_s
        self.max_submits = max_submits
        self.auto_approve_permit2 = auto_approve_permit2
        self._http = httpx.Client(
            base_url=url,
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
            headers={"User-Agent": "paddock-python/0.1.0"},
        )

    @property
    def address(self) -> str:
        return str(self.account.address)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # requests ----------------------------------------------------------------------------------------

    def auth_headers(self) -> dict[str, str]:
        """A fresh signature: the address as sent, the time in ms and a new UUID nonce."""
        timestamp, nonce = str(int(time.time() * 1000)), str(uuid.uuid4())
        message = f"{self.address}:{timestamp}:{nonce}"
        signature = bytes(self.account.sign_message(encode_defunct(text=message)).signature)
        return {
            "X-Wallet-Address": self.address,
            "X-Signature": "0x" + signature.hex(),
            "X-Timestamp": timestamp,
            "X-Nonce": nonce,
        }

    def send(
        self, method: str, path: str, *, signed: bool = True, rate_limit_retries: int = 5, **kwargs: Any
    ) -> httpx.Response:
        """One request, re-signed on every attempt; waits out 429s (``Retry-After``)."""
        extra = kwargs.pop("headers", {})
        attempt = 0
        while True:
            headers = {**(self.auth_headers() if signed else {}), **extra}
            try:
                resp = self._http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                raise TransportError(str(exc) or type(exc).__name__) from exc
            if resp.status_code != 429 or attempt >= rate_limit_retries:
                return resp
            attempt += 1
            time.sleep(_base.parse_retry_after(resp.headers.get("retry-after")) or 1.0)

    def _json(self, resp: httpx.Response) -> Any:
        _base.raise_for_error(resp)
        return resp.json()

    def chains(self) -> list[Chain]:
        """The chains the gateway takes payments on, with their tokens."""
        return [
            Chain.from_api(c) for c in self._json(self.send("GET", "/agent/chains", signed=False))["chains"]
        ]

    def recipients(self) -> Recipients:
        """Where payments go, per chain."""
        return Recipients.from_api(self._json(self.send("GET", "/agent/recipients", signed=False)))

    def balance(self, address: str | None = None, chain: str = "base") -> WalletBalance:
        """``address``'s (default: this wallet's) balance of each accepted token on ``chain``."""
        path = f"/agent/balance/{address or self.address}"
        return WalletBalance.from_api(
            self._json(self.send("GET", path, signed=False, params={"chain": chain}))
        )

    def projects(self) -> list[Project]:
        """This wallet's projects, newest first."""
        return [Project.from_api(p) for p in self._json(self.send("GET", "/agent/projects"))["projects"]]

    def status(self, project_id: str, deployment_id: str) -> DeploymentStatus:
        return DeploymentStatus.from_api(
            self._json(self.send("GET", f"/agent/deploy/{project_id}/{deployment_id}/status"))
        )

    def delete_project(self, project_id: str) -> ProjectDeleted:
        """Delete the project on the platform (irreversible); it lists as ``deleting`` until gone."""
        return ProjectDeleted.from_api(self._json(self.send("DELETE", f"/agent/projects/{project_id}")))

    # deploy ------------------------------------------------------------------------------------------

    def deploy(
        self,
        source: str | os.PathLike[str] | Mapping[str, bytes | str],
        *,
        unique_name: str,
        display_name: str | None = None,
        description: str | None = None,
        months: int = 1,
        settings: Mapping[str, Any] | None = None,
        chain: str = "base",
        token: str = "usdc",
        use_existing_credits: bool = False,
        pay_with: str = "transfer",
        scheme: str = "exact",
        method: str | None = None,
        wait: bool = True,
        timeout_s: float = 600.0,
        on_progress: Progress | None = None,
    ) -> Deployment:
        """Deploy ``source`` (a directory, a ``.zip`` or ``{path: content}``), paying if quoted.

        ``pay_with``: ``"transfer"`` sends an ERC-20 transfer of ``token`` (needs an RPC URL and gas);
        ``"x402"`` signs the 402's offer for ``token`` (``usdc``, ``usdt`` or an address) by ``scheme``
        (``exact``: the quote now; ``upto``: the quote as a maximum, settled later for the runtime used)
        and ``method`` (``eip3009`` or ``permit2``; default: EIP-3009 where the token has it), and the
        gateway settles it. An offer the 402 does not make raises ``OfferNotFoundError`` (a
        ``ValueError``) before anything is signed. Permit2 needs the wallet's ERC-20 allowance to the
        Permit2 contract: given an RPC URL for ``chain``, a short allowance is approved first (one
        transaction, gas of the wallet's own; ``auto_approve_permit2=False`` turns it off).

        Returns once the deployment is ``ready`` (``wait=False``: once accepted). Raises
        ``InsufficientFundsError`` before paying when the wallet is short, ``PaymentVerificationError``
        when the gateway refuses a transfer, ``DeploymentFailedError`` when the build fails,
        ``WaitTimeoutError`` after ``timeout_s``.
        """
        if pay_with not in ("transfer", "x402"):
            raise ValueError(f"pay_with must be 'transfer' or 'x402', not {pay_with!r}")
        token = token.lower() if not token.startswith("0x") else token
        if pay_with == "x402":
            x402.check_preference(token, scheme, method)
        elif scheme != "exact" or method is not None:
            raise ValueError("scheme and method are x402's: pass pay_with='x402'")
        report = on_progress or (lambda stage, detail: None)
        upload = upload_of(source)
        body = _base.drop_none(
            {
                "uniqueName": unique_name,
                "displayName": display_name or unique_name,
                "description": description,
                "months": months,
                "settings": dict(settings) if settings else None,
                "upload": upload,
            }
        )
        report("upload", {"files": len(upload.get("files", [])) or 1, "bytes": len(json.dumps(body))})
        pending = self._resumable()
        tx_hash: str | None = None
        amount_usd: float | None = None
        if pending is not None:
            report("payment", {"tx_hash": pending.tx_hash, "resumed": True})
            accepted = self._submit(pending, body, report)
            tx_hash = pending.tx_hash
        else:
            extra = {"X-Use-Existing-Credits": "true"} if use_existing_credits else {}
            first = self._post_deploy(body, extra)
            if first.status_code == 402 and _code(first) == "payment_required":
                quote = first.json()
                amount_usd = quote.get("amount_usd")
                report("quote", quote)
                if pay_with == "x402":
                    header = self._sign_x402(first, quote, chain, (token, scheme, method), report)
                    accepted, tx_hash = self._submit_x402(header, body, report)
                else:
                    payment = self._pay(quote, chain, token, report)
                    tx_hash = payment.tx_hash
                    accepted = self._submit(payment, body, report)
            else:
                accepted = self._accepted_or_raise(first, body)
        deployment = Deployment(
            project_id=accepted["projectId"],
            deployment_id=accepted.get("deploymentId"),
            status=str(accepted.get("status", "deploying")),
            tx_hash=tx_hash,
            amount_usd=amount_usd,
        )
        report("build", {"projectId": deployment.project_id, "status": "deploying"})
        if wait:
            self._wait(deployment, unique_name, timeout_s, report)
        return deployment

    def _post_deploy(self, body: dict[str, Any], extra: dict[str, str]) -> httpx.Response:
        return self.send("POST", "/agent/deploy", json=body, headers=extra)

    def _accepted_or_raise(self, resp: httpx.Response, body: dict[str, Any]) -> dict[str, Any]:
        if resp.status_code == 200:
            return dict(resp.json())
        if resp.status_code == 402:
            raise PaymentError(
                "the gateway asked for a payment where credits were expected; not paying again"
            )
        if resp.status_code == 400 and _code(resp) == "name_taken":
            adopted = self._adopt(body["uniqueName"])
            if adopted is not None:
                return adopted
        _base.raise_for_error(resp)
        raise APIError(resp.status_code, "unexpected answer from the gateway")

    def _adopt(self, unique_name: str) -> dict[str, Any] | None:
        """After a lost answer the deploy may already exist: this wallet's project of that name."""
        for project in self.projects():
            if project.name.lower() == unique_name.lower():
                return {"projectId": project.id, "deploymentId": None, "status": "deploying"}
        return None

    # paying ------------------------------------------------------------------------------------------

    def _web3(self, chain: str) -> Any:
        from web3 import Web3

        rpc_url = self.rpc_urls.get(chain)
        if not rpc_url:
            raise PaymentError(
                f"no RPC URL for chain {chain!r} (rpc_urls or PADDOCK_RPC_URL_{chain.upper()})"
            )
        return Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 30}))

    def _pay(self, quote: dict[str, Any], chain: str, token: str, report: Progress) -> Payment:
        w3 = self._web3(chain)
        expected = {c["chain"]: c["chain_id"] for c in quote.get("supported_chains") or self.chains()}
        if chain not in expected:
            raise PaymentError(f"the gateway does not accept chain {chain!r}")
        if w3.eth.chain_id != expected[chain]:
            raise PaymentError(f"the RPC for {chain} is chain {w3.eth.chain_id}, not {expected[chain]}")
        balances = {b["token"]: b for b in self.balance(chain=chain)["balances"]}
        if token not in balances:
            raise PaymentError(f"the gateway does not accept token {token!r} on {chain}")
        contract = w3.eth.contract(address=w3.to_checksum_address(balances[token]["address"]), abi=ERC20_ABI)
        amount = int(quote["amount_token"])
        held = int(contract.functions.balanceOf(self.address).call())
        if held < amount:
            raise InsufficientFundsError(
                f"{self.address} holds {held} raw {token} on {chain}; the quote is {amount}"
            )
        tx = contract.functions.transfer(w3.to_checksum_address(quote["pay_to"]), amount).build_transaction(
            {"from": self.address, "nonce": w3.eth.get_transaction_count(self.address, "pending")}
        )
        gas_cost = int(tx["gas"]) * int(tx.get("maxFeePerGas") or tx.get("gasPrice") or 0)
        if w3.eth.get_balance(self.address) < gas_cost:
            raise InsufficientFundsError(f"{self.address} has too little native currency for gas on {chain}")
        signed = self.account.sign_transaction(tx)
        payment = Payment(
            gateway=self.base_url,
            wallet=self.address.lower(),
            chain=chain,
            token=token,
            tx_hash="0x" + bytes(signed.hash).hex(),
            raw_tx="0x" + bytes(signed.raw_transaction).hex(),
            nonce=int(tx["nonce"]),
            amount_token=str(amount),
        )
        self.ledger.record(payment)  # before it leaves this machine: a retry will find it
        w3.eth.send_raw_transaction(payment.raw_tx)
        self.ledger.set_state(payment.tx_hash, "sent")
        report("payment", {"tx_hash": payment.tx_hash, "amount_token": payment.amount_token})
        self._confirm(payment, w3)
        return payment

    def _confirm(self, payment: Payment, w3: Any) -> None:
        receipt = w3.eth.wait_for_transaction_receipt(payment.tx_hash, timeout=300)
        if int(receipt["status"]) != 1:
            self.ledger.set_state(payment.tx_hash, "reverted")
            raise PaymentError(
                f"the transfer {payment.tx_hash} reverted: nothing was paid", tx_hash=payment.tx_hash
            )
        self.ledger.set_state(payment.tx_hash, "mined")

    def _resumable(self) -> Payment | None:
        """An earlier payment of this wallet the gateway has not accepted yet, made sure to be mined."""
        from web3.exceptions import TransactionNotFound

        for payment in self.ledger.unresolved(self.base_url, self.address):
            if payment.state == "mined":
                return payment
            w3 = self._web3(payment.chain)
            try:
                w3.eth.get_transaction_receipt(payment.tx_hash)
            except TransactionNotFound:
                if w3.eth.get_transaction_count(self.address, "latest") > payment.nonce:
                    try:
                        w3.eth.get_transaction(payment.tx_hash)
                    except TransactionNotFound:  # its nonce went to another transaction
                        self.ledger.set_state(payment.tx_hash, "dropped")
                        continue
                try:
                    w3.eth.send_raw_transaction(payment.raw_tx)
                except ValueError as exc:  # "already known" and the like
                    if "known" not in str(exc).lower():
                        raise
            self._confirm(payment, w3)
            return payment
        return None

    def _submit(self, payment: Payment, body: dict[str, Any], report: Progress) -> dict[str, Any]:
        """The paying call with ``payment``'s hash, repeated (never re-paid) until it is settled."""
        headers = {
            "X-Payment-Tx": payment.tx_hash,
            "X-Payment-Chain": payment.chain,
            "X-Payment-Token": payment.token,
        }
        problem = "no answer"
        for attempt in range(self.max_submits):
            if attempt:
                time.sleep(min(30.0, 0.5 * 2**attempt))
            try:
                resp = self._post_deploy(body, headers)
            except TransportError as exc:
                problem = f"no answer ({exc})"
                continue
            code = _code(resp)
            if resp.status_code == 200:
                self.ledger.set_state(payment.tx_hash, "resolved")
                report("confirmation", {"tx_hash": payment.tx_hash})
                return dict(resp.json())
            if resp.status_code == 409 or code == "deploy_failed_after_topup":
                # the credits exist; deploy on them, never pay again
                self.ledger.set_state(payment.tx_hash, "resolved", f"credited ({code})")
                report("confirmation", {"tx_hash": payment.tx_hash, "credited": True})
                return self._accepted_or_raise(
                    self._post_deploy(body, {"X-Use-Existing-Credits": "true"}), body
                )
            if resp.status_code == 402 and code == "payment_verification_failed":
                reason = resp.json().get("reason")
                if reason in NOT_YET:
                    problem = f"verification: {reason}"
                    continue
                self.ledger.set_state(payment.tx_hash, "refused", str(reason))
                raise PaymentVerificationError(
                    f"the gateway refused the transfer {payment.tx_hash}: {reason}",
                    tx_hash=payment.tx_hash,
                    reason=reason,
                )
            if code == "name_taken":
                # names are checked before payments: after a lost answer our own deploy holds it
                adopted = self._adopt(body["uniqueName"])
                if adopted is not None:
                    self.ledger.set_state(payment.tx_hash, "resolved", "deployed (answer lost)")
                    report("confirmation", {"tx_hash": payment.tx_hash, "adopted": True})
                    return adopted
                raise PaymentError(
                    f"{body['uniqueName']!r} was taken by someone else after the quote; the transfer "
                    f"{payment.tx_hash} is kept in {self.ledger.path} and the next deploy (under another "
                    "name) resubmits it instead of paying again",
                    tx_hash=payment.tx_hash,
                )
            if code == "topup_failed" or resp.status_code in (500, 502, 503):
                problem = f"{resp.status_code} {code}"
                continue
            _base.raise_for_error(resp)  # a 4xx about the request: the payment stays for the next try
        raise PaymentError(
            f"the gateway did not settle the transfer {payment.tx_hash} ({problem}); it is kept in "
            f"{self.ledger.path} and the next deploy resubmits it instead of paying again",
            tx_hash=payment.tx_hash,
        )

    # paying by signature (x402) ---------------------------------------------------------------------

    def _sign_x402(
        self,
        quote_response: httpx.Response,
        quote: dict[str, Any],
        chain: str,
        preference: tuple[str, str, str | None],
        report: Progress,
    ) -> str:
        """A ``PAYMENT-SIGNATURE`` for the quote's offer on ``chain`` that matches ``preference`` (asset,
        scheme, method; see :mod:`paddock.x402`), of exactly the quoted amount to this chain's recipient.
        The offer must agree with the JSON quote and ``/agent/recipients``, so a header cannot redirect
        the payment or change its amount. A Permit2 offer first makes sure of the allowance."""
        raw = quote_response.headers.get(PAYMENT_REQUIRED)
        if not raw:
            raise PaymentError("the gateway offers no x402 payment (no PAYMENT-REQUIRED header)")
        required = x402.decode_header(raw)
        chain_ids = {c.chain: int(c.chain_id) for c in self._chains_of(quote)}
        if chain not in chain_ids:
            raise PaymentError(f"the gateway does not accept chain {chain!r}")
        asset, scheme, method = preference
        offer = x402.choose(
            x402.parse_offers(required), asset=asset, scheme=scheme, method=method, chain_id=chain_ids[chain]
        )
        recipient = next((r.address for r in self.recipients().recipients if r.chain == chain), None)
        if str(offer.amount) != str(quote["amount_token"]) or (
            recipient is None or offer.pay_to.lower() != recipient.lower()
        ):
            raise PaymentError("the x402 offer does not match the quote (amount or recipient); not signing")
        if offer.method == x402.PERMIT2:
            self._ensure_permit2_allowance(chain, offer, report)
        payload = x402.sign(self.account, offer, required.get("resource"))
        report(
            "payment",
            {
                "method": "x402",
                "scheme": offer.scheme,
                "transfer_method": offer.method,
                "asset": offer.symbol,
                "nonce": x402.nonce_of(payload),
                "amount_token": str(offer.amount),
            },
        )
        return x402.encode_header(payload)

    def _chains_of(self, quote: dict[str, Any]) -> list[Chain]:
        listed = quote.get("supported_chains")
        return [Chain.from_api(c) for c in listed] if listed else self.chains()

    def permit2_allowance(self, chain: str, token_address: str) -> int:
        """This wallet's ERC-20 allowance to Permit2 for ``token_address`` on ``chain`` (needs its RPC)."""
        w3 = self._web3(chain)
        data = permit2.allowance_calldata(self.address)
        return int.from_bytes(bytes(w3.eth.call({"to": w3.to_checksum_address(token_address), "data": data})))

    def approve_permit2(self, chain: str, token_address: str, amount: int = permit2.UINT256_MAX) -> str:
        """Send ``approve(Permit2, amount)`` from this wallet (gas on ``chain``, its RPC URL) and wait for it:
        what a wallet does once per token before paying by Permit2. Returns the transaction hash."""
        w3 = self._web3(chain)
        tx = {
            "from": self.address,
            "to": w3.to_checksum_address(token_address),
            "data": permit2.approve_calldata(amount),
            "nonce": w3.eth.get_transaction_count(self.address, "pending"),
            "chainId": w3.eth.chain_id,
        }
        tx["gas"] = int(w3.eth.estimate_gas(tx) * 12 // 10)
        tx["gasPrice"] = int(w3.eth.gas_price)
        if w3.eth.get_balance(self.address) < tx["gas"] * tx["gasPrice"]:
            raise InsufficientFundsError(
                f"{self.address} has too little native currency on {chain} to approve Permit2"
            )
        signed = self.account.sign_transaction(tx)
        tx_hash = "0x" + bytes(w3.eth.send_raw_transaction(signed.raw_transaction)).hex()
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=300)
        if int(receipt["status"]) != 1:
            raise PaymentError(f"approve(Permit2) {tx_hash} reverted", tx_hash=tx_hash)
        return tx_hash

    def _ensure_permit2_allowance(self, chain: str, offer: x402.Offer, report: Progress) -> None:
        """With ``auto_approve_permit2`` and an RPC URL for ``chain``: approve Permit2 (unlimited, as x402 and
        Permit2 expect; each payment is bounded by its own signature) when the allowance is short. Without
        an RPC URL nothing is read or sent: a short allowance comes back as ``permit2_allowance_required``."""
        if not self.auto_approve_permit2 or chain not in self.rpc_urls:
            return
        allowance = self.permit2_allowance(chain, offer.asset)
        if allowance >= offer.amount:
            return
        if allowance and offer.symbol == "usdt":  # USDT refuses to change a non-zero allowance
            self.approve_permit2(chain, offer.asset, 0)
        tx_hash = self.approve_permit2(chain, offer.asset)
        report("approval", {"tx_hash": tx_hash, "asset": offer.symbol, "spender": permit2.PERMIT2_ADDRESS})

    def _submit_x402(
        self, header: str, body: dict[str, Any], report: Progress
    ) -> tuple[dict[str, Any], str | None]:
        """The paying call with one authorization, repeated (never re-signed) until it is settled."""
        problem = "no answer"
        for attempt in range(self.max_submits):
            if attempt:
                time.sleep(min(30.0, 0.5 * 2**attempt))
            try:
                resp = self._post_deploy(body, {PAYMENT_SIGNATURE: header})
            except TransportError as exc:
                problem = f"no answer ({exc})"
                continue
            code = _code(resp)
            if resp.status_code == 200:
                tx_hash = _settlement(resp).get("transaction") or None
                report("confirmation", {"tx_hash": tx_hash, "method": "x402"})
                return dict(resp.json()), tx_hash
            if resp.status_code == 409 or code == "deploy_failed_after_topup":
                # settled by an earlier attempt whose answer was lost: the credits exist, use them
                tx_hash = resp.json().get("tx_hash")
                report("confirmation", {"tx_hash": tx_hash, "credited": True, "method": "x402"})
                return self._accepted_or_raise(
                    self._post_deploy(body, {"X-Use-Existing-Credits": "true"}), body
                ), tx_hash
            self._raise_refusal(resp)
            if code == "name_taken":
                adopted = self._adopt(body["uniqueName"])
                if adopted is not None:
                    return adopted, None
                raise PaymentError(f"{body['uniqueName']!r} was taken after the quote; nothing was paid")
            if code == "topup_failed" or resp.status_code in (500, 502, 503):
                problem = f"{resp.status_code} {code}"
                continue
            _base.raise_for_error(resp)
        raise PaymentError(f"the gateway did not settle the x402 authorization ({problem})")

    # wallet sandboxes (POST /agent/sandboxes) -------------------------------------------------------

    def create_wallet_sandbox(
        self,
        *,
        seconds: int = 3600,
        shape: str | None = None,
        rootfs: str | None = None,
        chain: str = "base",
        token: str = "usdc",
        scheme: str = "exact",
        method: str | None = None,
        on_progress: Progress | None = None,
    ) -> WalletSandbox:
        """Rent a sandbox with this wallet alone, paid by x402: ``exact`` buys ``seconds`` of running up
        front; ``upto`` authorises ``seconds`` × the price as a maximum, settled for the seconds it really
        ran (paused time is free). ``token``/``method`` as for ``deploy``. Returns the sandbox with its
        access token; raises ``OfferNotFoundError`` (nothing signed) when the 402 has no such offer."""
        token = token.lower() if not token.startswith("0x") else token
        x402.check_preference(token, scheme, method)
        report = on_progress or (lambda stage, detail: None)
        body = _base.drop_none({"shape": shape, "rootfs": rootfs, "seconds": seconds})
        first = self.send("POST", WALLET_SANDBOXES, signed=False, json=body)
        if first.status_code != 402 or _code(first) != "payment_required":
            _base.raise_for_error(first)
            raise APIError(first.status_code, "the gateway created a sandbox without a payment")
        quote = dict(first.json())
        report("quote", quote)
        header = self._sign_x402(first, quote, chain, (token, scheme, method), report)
        problem = "no answer"
        for attempt in range(self.max_submits):
            if attempt:
                time.sleep(min(30.0, 0.5 * 2**attempt))
            try:
                resp = self.send(
                    "POST", WALLET_SANDBOXES, signed=False, json=body, headers={PAYMENT_SIGNATURE: header}
                )
            except TransportError as exc:
                problem = f"no answer ({exc})"
                continue
            code = _code(resp)
            if resp.status_code == 201:
                sandbox = WalletSandbox.from_api(resp.json())
                report("confirmation", {"tx_hash": sandbox.transaction, "method": "x402"})
                return sandbox
            if resp.status_code == 409 and attempt:
                raise PaymentError(
                    "an earlier attempt with this payment was taken but its answer was lost: the sandbox "
                    "exists (wallet_sandboxes() lists it; delete it to stop paying) and its access token "
                    "cannot be shown again"
                )
            self._raise_refusal(resp)
            if code == "upstream_unavailable" or resp.status_code in (500, 503):
                problem = f"{resp.status_code} {code}"
                continue
            _base.raise_for_error(resp)
        raise PaymentError(f"the gateway did not answer the paid sandbox request ({problem})")

    def wallet_sandboxes(self) -> list[dict[str, Any]]:
        """This wallet's sandboxes not deleted: state, running/remaining seconds, price."""
        return list(self._json(self.send("GET", WALLET_SANDBOXES))["sandboxes"])

    def pause_wallet_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        """Pause it: running time (and so billing) stops."""
        return dict(self._json(self.send("POST", f"{WALLET_SANDBOXES}/{_segment(sandbox_id)}/pause")))

    def resume_wallet_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        return dict(self._json(self.send("POST", f"{WALLET_SANDBOXES}/{_segment(sandbox_id)}/resume")))

    def delete_wallet_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        """Destroy it (and its token); an ``upto`` authorisation is then settled for its running seconds."""
        return dict(self._json(self.send("DELETE", f"{WALLET_SANDBOXES}/{_segment(sandbox_id)}")))

    def _raise_refusal(self, resp: httpx.Response) -> None:
        """A 402 refusal of a signed payment, as ``PaymentError``s with x402's reason."""
        if resp.status_code != 402 or _code(resp) != "payment_verification_failed":
            return
        reason = resp.json().get("reason")
        if reason == X402_INSUFFICIENT:
            raise InsufficientFundsError(
                f"{self.address} holds less of the token than asked; nothing was paid"
            )
        if reason == X402_ALLOWANCE:
            raise PaymentVerificationError(f"{ALLOWANCE_HINT}; nothing was paid", tx_hash=None, reason=reason)
        raise PaymentVerificationError(
            f"the gateway refused the x402 payment: {reason}", tx_hash=None, reason=reason
        )

    # waiting -----------------------------------------------------------------------------------------

    def _wait(self, deployment: Deployment, unique_name: str, timeout_s: float, report: Progress) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if deployment.deployment_id:
                status = self.status(deployment.project_id, deployment.deployment_id).to_dict()
            else:  # adopted after a lost answer: only the project listing knows it
                status = self._project_status(deployment.project_id)
            deployment.last_status = status
            deployment.status = status["status"]
            report("build", status)
            if status["status"] == "ready":
                deployment.url = status.get("endpoint")
                report("ready", status)
                return
            if status["status"] == "failed":
                reason = status.get("reason")
                raise DeploymentFailedError(
                    f"deployment of {unique_name} failed: {reason}", reason=reason, status=status
                )
            if time.monotonic() >= deadline:
                raise WaitTimeoutError(f"deployment of {unique_name} still deploying after {timeout_s}s")
            time.sleep(self.poll_interval_s)

    def _project_status(self, project_id: str) -> dict[str, Any]:
        for project in self.projects():
            if project.id == project_id:
                if project.status == "active" and project.url:
                    return {"status": "ready", "endpoint": project.url}
                if project.status in ("failed", "deleting"):
                    return {"status": "failed", "reason": f"project {project.status}"}
                return {"status": "deploying", "deployment_status": project.status}
        return {"status": "failed", "reason": "project not found"}


def _settlement(resp: httpx.Response) -> dict[str, Any]:
    """The ``PAYMENT-RESPONSE`` header (an x402 ``SettlementResponse``), or {} if absent or unreadable."""
    raw = resp.headers.get(PAYMENT_RESPONSE)
    if not raw:
        return {}
    try:
        value = json.loads(base64.b64decode(raw, validate=True))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _segment(value: str) -> str:
    """One path segment: an id as given, never a way up or across the path."""
    if value in ("", ".", ".."):
        raise ValueError(f"not a sandbox id: {value!r}")
    return urllib.parse.quote(value, safe="")


def _code(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


__all__ = ["Deployment", "GatewayClient", "WalletSandbox", "upload_of"]

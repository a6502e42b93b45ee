// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ISignatureTransfer} from "Permit2.sol";

/// @title x402's upto Permit2 proxy (dev chain): the spender x402 clients name in an `upto` Permit2 signature.
/// @notice Installed with anvil_setCode at the proxy's canonical address
///         (0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002), beside Permit2 and the exact proxy. It implements
///         the interface x402's clients and facilitators use:
///           settle(permit, amount, owner, witness, signature)
///         moves `amount` (at most `permit.permitted.amount`, the maximum the owner authorised) from `owner`
///         to `witness.to` through Permit2's `permitWitnessTransferFrom`, with the witness type x402's `upto`
///         clients sign:
///           Witness(address to,address facilitator,uint256 validAfter)
///         Only `witness.facilitator` may submit it (the owner chose who settles, and so who picks the
///         amount); nobody can change the destination or exceed the maximum, and Permit2 spends the nonce,
///         so an authorisation settles once whatever the amount. Permit2's address is a constant (the code
///         is copied in, no constructor runs). Not implemented: `settleWithPermit` (EIP-2612 gas
///         sponsoring; the test tokens have no EIP-2612).
contract X402UptoPermit2Proxy {
    ISignatureTransfer public constant PERMIT2 = ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);

    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)";
    bytes32 public constant WITNESS_TYPEHASH =
        keccak256("Witness(address to,address facilitator,uint256 validAfter)");

    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    event Settled();

    error AmountExceedsPermitted();
    error InvalidOwner();
    error InvalidDestination();
    error PaymentTooEarly();
    error UnauthorizedFacilitator();
    error Reentered();

    bool transient private entered;

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external {
        if (entered) revert Reentered();
        entered = true;
        if (amount > permit.permitted.amount) revert AmountExceedsPermitted();
        if (owner == address(0)) revert InvalidOwner();
        if (witness.to == address(0)) revert InvalidDestination();
        if (msg.sender != witness.facilitator) revert UnauthorizedFacilitator();
        if (block.timestamp < witness.validAfter) revert PaymentTooEarly();
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: witness.to, requestedAmount: amount}),
            owner,
            keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.facilitator, witness.validAfter)),
            WITNESS_TYPE_STRING,
            signature
        );
        entered = false;
        emit Settled();
    }
}

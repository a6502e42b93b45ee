// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ISignatureTransfer} from "Permit2.sol";

/// @title x402's exact Permit2 proxy (dev chain): the spender x402 clients name in their Permit2 signatures.
/// @notice Installed with anvil_setCode at the proxy's canonical address
///         (0x402085c248EeA27D92E8b30b2C58ed07f9E20001), beside Permit2 at its own. It implements the
///         interface x402's clients and facilitators use: `settle(permit, owner, witness, signature)`
///         moves exactly `permit.permitted.amount` from `owner` to `witness.to` through Permit2's
///         `permitWitnessTransferFrom`, with the witness type x402 clients sign:
///           Witness(address to,uint256 validAfter)
///         Whoever submits the transaction (the facilitator, who pays the gas) cannot change the amount
///         or the destination: both are under the owner's signature. Permit2's address is a constant
///         (nothing is initialised: the code is copied in, no constructor runs). Not implemented:
///         `settleWithPermit` (the EIP-2612 gas-sponsoring path; the test tokens have no EIP-2612).
contract X402ExactPermit2Proxy {
    ISignatureTransfer public constant PERMIT2 = ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);

    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,uint256 validAfter)";
    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,uint256 validAfter)");

    struct Witness {
        address to;
        uint256 validAfter;
    }

    event Settled();

    error InvalidAmount();
    error InvalidOwner();
    error InvalidDestination();
    error PaymentTooEarly();
    error Reentered();

    bool transient private entered;

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external {
        if (entered) revert Reentered();
        entered = true;
        if (permit.permitted.amount == 0) revert InvalidAmount();
        if (owner == address(0)) revert InvalidOwner();
        if (witness.to == address(0)) revert InvalidDestination();
        if (block.timestamp < witness.validAfter) revert PaymentTooEarly();
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: witness.to, requestedAmount: permit.permitted.amount}),
            owner,
            keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.validAfter)),
            WITNESS_TYPE_STRING,
            signature
        );
        entered = false;
        emit Settled();
    }
}

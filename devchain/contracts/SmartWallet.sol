// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title SmartWallet: a minimal contract wallet with one owner, for the gateway's smart-wallet tests.
/// @notice EIP-1271: `isValidSignature(hash, signature)` returns 0x1626ba7e when `signature` is the
///         owner's 65-byte ECDSA signature (r, s, v) over `hash` itself (no prefix: the caller hashes, as
///         Permit2 and EIP-191 verifiers do), and 0xffffffff otherwise; it never reverts on a bad
///         signature. `execute` lets the owner act as the wallet (an ERC-20 `approve(Permit2, …)`, say).
///         Not a production wallet: no upgrades, no batching, no replay protection across wallets.
contract SmartWallet {
    bytes4 private constant MAGIC = 0x1626ba7e;
    bytes4 private constant INVALID = 0xffffffff;
    // secp256k1n / 2: signatures with a higher s are malleable copies and refused (as OpenZeppelin does).
    uint256 private constant HALF_ORDER = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0;

    address public immutable owner;

    constructor(address owner_) {
        owner = owner_;
    }

    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return INVALID;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (v < 27) v += 27;
        if (uint256(s) > HALF_ORDER || (v != 27 && v != 28)) return INVALID;
        address signer = ecrecover(hash, v, r, s);
        return signer != address(0) && signer == owner ? MAGIC : INVALID;
    }

    function execute(address target, uint256 value, bytes calldata data) external returns (bytes memory) {
        require(msg.sender == owner, "SmartWallet: not the owner");
        (bool ok, bytes memory returned) = target.call{value: value}(data);
        if (!ok) {
            assembly {
                revert(add(returned, 32), mload(returned))
            }
        }
        return returned;
    }

    receive() external payable {}
}

/// @title SmartWalletFactory: deploys a SmartWallet per (owner, salt) with CREATE2, so its address is
///        known before it exists (an EIP-6492 counterfactual wallet signs with `createAccount`'s calldata).
contract SmartWalletFactory {
    event AccountCreated(address indexed account, address indexed owner, uint256 salt);

    /// @notice Deploys the wallet, or returns it if it already exists (so a repeated call is harmless).
    function createAccount(address owner, uint256 salt) external returns (address account) {
        account = getAddress(owner, salt);
        if (account.code.length > 0) return account;
        account = address(new SmartWallet{salt: bytes32(salt)}(owner));
        emit AccountCreated(account, owner, salt);
    }

    function getAddress(address owner, uint256 salt) public view returns (address) {
        bytes32 codeHash = keccak256(abi.encodePacked(type(SmartWallet).creationCode, abi.encode(owner)));
        return address(uint160(uint256(keccak256(abi.encodePacked(bytes1(0xff), address(this), bytes32(salt), codeHash)))));
    }
}

// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

interface IERC1271Wallet {
    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4);
}

/// @title ValidateSigOffchain: ERC-6492's off-chain signature check, run as a contract *creation* inside
///        one `eth_call` (no `to`): the constructor verifies and returns one 32-byte word, 1 (valid) or 0,
///        instead of runtime code, so nothing is ever deployed and no state survives the call.
/// @notice The gateway's own implementation of the ERC-6492 reference algorithm
///         (`UniversalSigValidator.isValidSigWithSideEffects` + `ValidateSigOffchain`):
///         - the signature ends with the 32-byte magic 0x6492…6492: it is
///           `abi.encode(factory, factoryCalldata, innerSignature) ‖ magic`. If the signer has no code
///           yet, `factory.call(factoryCalldata)` deploys it (in this call's scratch state only); then
///           `isValidSignature(hash, innerSignature)` must return 0x1626ba7e;
///         - else, a signer with code: EIP-1271 `isValidSignature(hash, signature)`;
///         - else, an EOA: ecrecover of a 65-byte (r, s, v) signature.
///         A factory call that reverts, or a wallet that reverts, is "invalid" (0), never a revert of the
///         call, so the answer is always one word.
contract ValidateSigOffchain {
    bytes32 private constant ERC6492_DETECTION_SUFFIX =
        0x6492649264926492649264926492649264926492649264926492649264926492;
    bytes4 private constant ERC1271_SUCCESS = 0x1626ba7e;

    constructor(address signer, bytes32 hash, bytes memory signature) {
        bool valid = _isValidSig(signer, hash, signature);
        assembly {
            mstore(0, valid)
            return(0, 32)
        }
    }

    function _isValidSig(address signer, bytes32 hash, bytes memory signature) private returns (bool) {
        uint256 length = signature.length;
        bool counterfactual = length >= 32 && _suffix(signature) == ERC6492_DETECTION_SUFFIX;
        bytes memory inner = signature;
        if (counterfactual) {
            bytes memory wrapped = new bytes(length - 32);
            for (uint256 i = 0; i < length - 32; i++) wrapped[i] = signature[i];
            address factory;
            bytes memory factoryCalldata;
            (factory, factoryCalldata, inner) = abi.decode(wrapped, (address, bytes, bytes));
            if (signer.code.length == 0) {
                (bool deployed,) = factory.call(factoryCalldata);
                if (!deployed) return false;
            }
        }
        if (signer.code.length > 0) {
            try IERC1271Wallet(signer).isValidSignature(hash, inner) returns (bytes4 magic) {
                return magic == ERC1271_SUCCESS;
            } catch {
                return false;
            }
        }
        if (counterfactual || inner.length != 65) return false;
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly {
            r := mload(add(inner, 32))
            s := mload(add(inner, 64))
            v := byte(0, mload(add(inner, 96)))
        }
        if (v < 27) v += 27;
        address recovered = ecrecover(hash, v, r, s);
        return recovered != address(0) && recovered == signer;
    }

    function _suffix(bytes memory signature) private pure returns (bytes32 word) {
        uint256 length = signature.length;
        assembly {
            word := mload(add(signature, length))
        }
    }
}

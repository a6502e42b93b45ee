// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title ISignatureTransfer: the single-token signature-transfer surface of Uniswap's Permit2, as its
///        published interface defines it (struct layouts, function selectors, errors), so calldata and
///        EIP-712 signatures made for the real Permit2 work here unchanged.
interface ISignatureTransfer {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    error InvalidAmount(uint256 maxAmount);
    error SignatureExpired(uint256 signatureDeadline);
    error InvalidNonce();
    error InvalidSignature();
    error InvalidSignatureLength();
    error InvalidSigner();
    error InvalidContractSignature();

    event UnorderedNonceInvalidation(address indexed owner, uint256 word, uint256 mask);

    function DOMAIN_SEPARATOR() external view returns (bytes32);

    function nonceBitmap(address owner, uint256 wordPos) external view returns (uint256);

    function permitTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes calldata signature
    ) external;

    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;

    function invalidateUnorderedNonces(uint256 wordPos, uint256 mask) external;
}

interface IERC1271 {
    function isValidSignature(bytes32 hash, bytes memory signature) external view returns (bytes4);
}

/// @title Permit2 (dev chain): signature transfers with unordered nonces, for the gateway's local chains.
/// @notice Installed with anvil_setCode at Permit2's canonical address
///         (0x000000000022D473030F116dDEE9F6B43aC78BA3), so nothing is set by a constructor. It implements
///         the SignatureTransfer half of Permit2 for one token per permit: `permitTransferFrom`,
///         `permitWitnessTransferFrom`, the `nonceBitmap` (slot 0, as in Permit2, where SignatureTransfer
///         comes first) and `invalidateUnorderedNonces`. Not implemented: batch permits and the
///         AllowanceTransfer half (`approve`/`permit`/`transferFrom` with expiring allowances).
///
///         EIP-712 domain: ("Permit2", block.chainid, address(this)) with no version, computed per call.
///         A nonce is one bit: word `nonce >> 8`, bit `nonce & 0xff` of the owner's bitmap; spending it
///         twice reverts `InvalidNonce()`. Signatures: 65-byte (r, s, v) or 64-byte EIP-2098 (r, vs) for
///         an owner without code, EIP-1271 `isValidSignature` for one with code. The tokens move with the
///         owner's ERC-20 allowance to this contract (`transferFrom`; a token that returns nothing counts
///         as success, as USDT's does).
contract Permit2 is ISignatureTransfer {
    mapping(address => mapping(uint256 => uint256)) public nonceBitmap;

    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,uint256 chainId,address verifyingContract)");
    bytes32 private constant NAME_HASH = keccak256("Permit2");
    bytes32 public constant TOKEN_PERMISSIONS_TYPEHASH = keccak256("TokenPermissions(address token,uint256 amount)");
    bytes32 public constant PERMIT_TRANSFER_FROM_TYPEHASH = keccak256(
        "PermitTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline)TokenPermissions(address token,uint256 amount)"
    );
    /// The witness variant's type string is this stub followed by the caller's `witnessTypeString`.
    string public constant PERMIT_WITNESS_TRANSFER_FROM_TYPE_STUB =
        "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,";

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(abi.encode(DOMAIN_TYPEHASH, NAME_HASH, block.chainid, address(this)));
    }

    function permitTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes calldata signature
    ) external {
        bytes32 dataHash = keccak256(
            abi.encode(
                PERMIT_TRANSFER_FROM_TYPEHASH, _hashPermissions(permit.permitted), msg.sender, permit.nonce, permit.deadline
            )
        );
        _transfer(permit, transferDetails, owner, dataHash, signature);
    }

    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external {
        bytes32 typeHash = keccak256(abi.encodePacked(PERMIT_WITNESS_TRANSFER_FROM_TYPE_STUB, witnessTypeString));
        bytes32 dataHash = keccak256(
            abi.encode(typeHash, _hashPermissions(permit.permitted), msg.sender, permit.nonce, permit.deadline, witness)
        );
        _transfer(permit, transferDetails, owner, dataHash, signature);
    }

    function invalidateUnorderedNonces(uint256 wordPos, uint256 mask) external {
        nonceBitmap[msg.sender][wordPos] |= mask;
        emit UnorderedNonceInvalidation(msg.sender, wordPos, mask);
    }

    function _hashPermissions(TokenPermissions calldata permitted) private pure returns (bytes32) {
        return keccak256(abi.encode(TOKEN_PERMISSIONS_TYPEHASH, permitted.token, permitted.amount));
    }

    function _transfer(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 dataHash,
        bytes calldata signature
    ) private {
        if (block.timestamp > permit.deadline) revert SignatureExpired(permit.deadline);
        if (transferDetails.requestedAmount > permit.permitted.amount) revert InvalidAmount(permit.permitted.amount);
        _useUnorderedNonce(owner, permit.nonce);
        _verify(keccak256(abi.encodePacked("\x19\x01", DOMAIN_SEPARATOR(), dataHash)), owner, signature);
        _safeTransferFrom(permit.permitted.token, owner, transferDetails.to, transferDetails.requestedAmount);
    }

    function _useUnorderedNonce(address owner, uint256 nonce) private {
        uint256 bit = 1 << (nonce & 0xff);
        uint256 flipped = nonceBitmap[owner][nonce >> 8] ^= bit;
        if (flipped & bit == 0) revert InvalidNonce();
    }

    function _verify(bytes32 digest, address owner, bytes calldata signature) private view {
        if (owner.code.length > 0) {
            bytes4 magic = IERC1271(owner).isValidSignature(digest, signature);
            if (magic != IERC1271.isValidSignature.selector) revert InvalidContractSignature();
            return;
        }
        bytes32 r;
        bytes32 s;
        uint8 v;
        if (signature.length == 65) {
            r = bytes32(signature[0:32]);
            s = bytes32(signature[32:64]);
            v = uint8(signature[64]);
        } else if (signature.length == 64) {
            r = bytes32(signature[0:32]);
            bytes32 vs = bytes32(signature[32:64]);
            s = vs & bytes32(0x7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff);
            v = uint8(uint256(vs >> 255)) + 27;
        } else {
            revert InvalidSignatureLength();
        }
        address signer = ecrecover(digest, v, r, s);
        if (signer == address(0)) revert InvalidSignature();
        if (signer != owner) revert InvalidSigner();
    }

    function _safeTransferFrom(address token, address from, address to, uint256 amount) private {
        require(token.code.length > 0, "Permit2: token has no code");
        (bool ok, bytes memory returned) = token.call(abi.encodeWithSelector(0x23b872dd, from, to, amount));
        require(ok && (returned.length == 0 || abi.decode(returned, (bool))), "TRANSFER_FROM_FAILED");
    }
}

// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title TestToken: a minimal 6-decimal ERC-20 with EIP-3009 for the gateway's local dev chains.
/// @notice The dev-chain tooling installs this runtime code at the real USDC/USDT addresses with
///         anvil_setCode, then writes `owner` (slot 0) with anvil_setStorageAt. Nothing is set by a
///         constructor, so the storage layout below is part of the contract with that tooling:
///           slot 0: owner, slot 1: balanceOf, slot 2: allowance, slot 3: totalSupply,
///           slot 4: authorizationState (EIP-3009 nonces).
///         `decimals`, `name`, `version` and `symbol` are constants in the code (no storage), and the
///         EIP-712 domain separator is computed per call from block.chainid and address(this): the code
///         is copied to another address after compilation, so nothing address-bound may be cached.
contract TestToken {
    address public owner;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    uint256 public totalSupply;
    mapping(address => mapping(bytes32 => bool)) public authorizationState;

    /// keccak256("TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)")
    bytes32 public constant TRANSFER_WITH_AUTHORIZATION_TYPEHASH =
        0x7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267;
    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    /// secp256k1n / 2: signatures with a higher s are malleable copies (EIP-2), refused as USDC does.
    uint256 private constant HALF_CURVE_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);

    function name() public pure virtual returns (string memory) {
        return "Paddock Test Dollar";
    }

    function version() public pure virtual returns (string memory) {
        return "1";
    }

    function symbol() external pure virtual returns (string memory) {
        return "PTD";
    }

    function decimals() external pure returns (uint8) {
        return 6;
    }

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(
            abi.encode(
                DOMAIN_TYPEHASH, keccak256(bytes(name())), keccak256(bytes(version())), block.chainid, address(this)
            )
        );
    }

    function mint(address to, uint256 value) external {
        require(msg.sender == owner, "TestToken: not owner");
        totalSupply += value;
        balanceOf[to] += value;
        emit Transfer(address(0), to, value);
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _move(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        require(allowed >= value, "TestToken: allowance");
        if (allowed != type(uint256).max) {
            allowance[from][msg.sender] = allowed - value;
        }
        _move(from, to, value);
        return true;
    }

    /// EIP-3009, the (v, r, s) form that USDC has always had.
    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        _transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s);
    }

    /// EIP-3009, the packed-signature form USDC v2.2 added (r ‖ s ‖ v, 65 bytes).
    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) external {
        require(signature.length == 65, "TestToken: invalid signature length");
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly {
            r := mload(add(signature, 0x20))
            s := mload(add(signature, 0x40))
            v := byte(0, mload(add(signature, 0x60)))
        }
        _transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s);
    }

    function _transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) private {
        require(block.timestamp > validAfter, "TestToken: authorization is not yet valid");
        require(block.timestamp < validBefore, "TestToken: authorization is expired");
        require(!authorizationState[from][nonce], "TestToken: authorization is used or canceled");
        bytes32 structHash =
            keccak256(abi.encode(TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce));
        bytes32 digest = keccak256(abi.encodePacked("\x19\x01", DOMAIN_SEPARATOR(), structHash));
        require(uint256(s) <= HALF_CURVE_ORDER && (v == 27 || v == 28), "TestToken: invalid signature");
        address signer = ecrecover(digest, v, r, s);
        require(signer != address(0) && signer == from, "TestToken: invalid signature");
        authorizationState[from][nonce] = true;
        emit AuthorizationUsed(from, nonce);
        _move(from, to, value);
    }

    function _move(address from, address to, uint256 value) private {
        require(balanceOf[from] >= value, "TestToken: balance");
        balanceOf[from] -= value;
        balanceOf[to] += value;
        emit Transfer(from, to, value);
    }
}

/// The USDC stand-in: the EIP-712 domain of real USDC on Base and Arbitrum One ("USD Coin", "2"), so a
/// client that signs for the real token signs exactly the same typed data here.
contract TestUSDC is TestToken {
    function name() public pure override returns (string memory) {
        return "USD Coin";
    }

    function version() public pure override returns (string memory) {
        return "2";
    }

    function symbol() external pure override returns (string memory) {
        return "USDC";
    }
}

// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title TestToken: a minimal 6-decimal ERC-20 for the gateway's local dev chains.
/// @notice The dev-chain tooling installs this runtime code at the real USDC/USDT addresses with
///         anvil_setCode, then writes `owner` (slot 0) with anvil_setStorageAt. Nothing is set by a
///         constructor, so the storage layout below is part of the contract with that tooling:
///           slot 0: owner, slot 1: balanceOf, slot 2: allowance, slot 3: totalSupply.
///         `decimals`, `name` and `symbol` are constants in the code (no storage).
contract TestToken {
    address public owner;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    uint256 public totalSupply;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    function name() external pure returns (string memory) {
        return "Paddock Test Dollar";
    }

    function symbol() external pure returns (string memory) {
        return "PTD";
    }

    function decimals() external pure returns (uint8) {
        return 6;
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

    function _move(address from, address to, uint256 value) private {
        require(balanceOf[from] >= value, "TestToken: balance");
        balanceOf[from] -= value;
        balanceOf[to] += value;
        emit Transfer(from, to, value);
    }
}

// Compiles the dev chain's contracts with the pinned solc-js: contracts/TestToken.sol into
// build/TestToken.json (the generic token, installed as USDT) and build/TestUSDC.json (USDC's EIP-712
// domain "USD Coin", "2"); contracts/Permit2.sol, contracts/X402ExactPermit2Proxy.sol and
// contracts/X402UptoPermit2Proxy.sol into build/Permit2.json, build/X402ExactPermit2Proxy.json and
// build/X402UptoPermit2Proxy.json (installed at their canonical addresses);
// contracts/SmartWallet.sol into build/SmartWallet.json and build/SmartWalletFactory.json (the smart-wallet
// tests deploy them); contracts/UniversalSigValidator.sol into build/ValidateSigOffchain.json and, since
// the gateway runs its creation code in an eth_call to check ERC-6492 signatures, a copy of that code in
// ../src/paddock_gateway/sig_validator.json (the package ships it; a test checks the two agree).
// Reproduce with:  cd devchain && npm ci && node build-token.js
// The output is committed; the dev-chain tooling reads `deployedBytecode` from it.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const FILES = [
  "TestToken.sol",
  "Permit2.sol",
  "X402ExactPermit2Proxy.sol",
  "X402UptoPermit2Proxy.sol",
  "SmartWallet.sol",
  "UniversalSigValidator.sol",
];
const sources = Object.fromEntries(
  FILES.map((file) => [file, { content: fs.readFileSync(path.join(__dirname, "contracts", file), "utf8") }]),
);
const input = {
  language: "Solidity",
  sources,
  settings: {
    evmVersion: "cancun",
    optimizer: { enabled: true, runs: 200 },
    metadata: { bytecodeHash: "none" },
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === "error");
if (errors.length) {
  for (const e of errors) console.error(e.formattedMessage);
  process.exit(1);
}
fs.mkdirSync(path.join(__dirname, "build"), { recursive: true });
const STORAGE = {
  TestToken: { owner: 0, balanceOf: 1, allowance: 2, totalSupply: 3, authorizationState: 4 },
  TestUSDC: { owner: 0, balanceOf: 1, allowance: 2, totalSupply: 3, authorizationState: 4 },
  Permit2: { nonceBitmap: 0 },
  X402ExactPermit2Proxy: {},
  X402UptoPermit2Proxy: {},
  SmartWallet: {},
  SmartWalletFactory: {},
  ValidateSigOffchain: {},
};
for (const [file, name] of [
  ["TestToken.sol", "TestToken"],
  ["TestToken.sol", "TestUSDC"],
  ["Permit2.sol", "Permit2"],
  ["X402ExactPermit2Proxy.sol", "X402ExactPermit2Proxy"],
  ["X402UptoPermit2Proxy.sol", "X402UptoPermit2Proxy"],
  ["SmartWallet.sol", "SmartWallet"],
  ["SmartWallet.sol", "SmartWalletFactory"],
  ["UniversalSigValidator.sol", "ValidateSigOffchain"],
]) {
  const contract = output.contracts[file][name];
  const artifact = {
    contractName: name,
    compiler: `solc-js ${solc.version()}`,
    settings: input.settings,
    storageLayout: STORAGE[name],
    abi: contract.abi,
    bytecode: "0x" + contract.evm.bytecode.object,
    deployedBytecode: "0x" + contract.evm.deployedBytecode.object,
  };
  fs.writeFileSync(path.join(__dirname, "build", `${name}.json`), JSON.stringify(artifact, null, 2) + "\n");
  console.log(`build/${name}.json written (${artifact.compiler}, ${(artifact.deployedBytecode.length - 2) / 2} bytes runtime)`);
}
{
  const validator = JSON.parse(fs.readFileSync(path.join(__dirname, "build", "ValidateSigOffchain.json"), "utf8"));
  const packaged = {
    contractName: validator.contractName,
    compiler: validator.compiler,
    source: "devchain/contracts/UniversalSigValidator.sol",
    constructor: "constructor(address signer, bytes32 hash, bytes signature)",
    bytecode: validator.bytecode,
  };
  const target = path.join(__dirname, "..", "src", "paddock_gateway", "sig_validator.json");
  fs.writeFileSync(target, JSON.stringify(packaged, null, 2) + "\n");
  console.log(`${path.relative(path.join(__dirname, ".."), target)} written`);
}

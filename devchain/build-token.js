// Compiles contracts/TestToken.sol with the pinned solc-js into build/TestToken.json (the generic
// token, installed as USDT) and build/TestUSDC.json (USDC's EIP-712 domain "USD Coin", "2").
// Reproduce with:  cd devchain && npm ci && node build-token.js
// The output is committed; the dev-chain tooling reads `deployedBytecode` from it.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const source = fs.readFileSync(path.join(__dirname, "contracts", "TestToken.sol"), "utf8");
const input = {
  language: "Solidity",
  sources: { "TestToken.sol": { content: source } },
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
for (const name of ["TestToken", "TestUSDC"]) {
  const contract = output.contracts["TestToken.sol"][name];
  const artifact = {
    contractName: name,
    compiler: `solc-js ${solc.version()}`,
    settings: input.settings,
    storageLayout: { owner: 0, balanceOf: 1, allowance: 2, totalSupply: 3, authorizationState: 4 },
    abi: contract.abi,
    bytecode: "0x" + contract.evm.bytecode.object,
    deployedBytecode: "0x" + contract.evm.deployedBytecode.object,
  };
  fs.writeFileSync(path.join(__dirname, "build", `${name}.json`), JSON.stringify(artifact, null, 2) + "\n");
  console.log(`build/${name}.json written (${artifact.compiler}, ${(artifact.deployedBytecode.length - 2) / 2} bytes runtime)`);
}

// Compiles contracts/TestToken.sol with the pinned solc-js into build/TestToken.json.
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
const contract = output.contracts["TestToken.sol"].TestToken;
const artifact = {
  contractName: "TestToken",
  compiler: `solc-js ${solc.version()}`,
  settings: input.settings,
  storageLayout: { owner: 0, balanceOf: 1, allowance: 2, totalSupply: 3 },
  abi: contract.abi,
  bytecode: "0x" + contract.evm.bytecode.object,
  deployedBytecode: "0x" + contract.evm.deployedBytecode.object,
};
fs.mkdirSync(path.join(__dirname, "build"), { recursive: true });
fs.writeFileSync(path.join(__dirname, "build", "TestToken.json"), JSON.stringify(artifact, null, 2) + "\n");
console.log(`build/TestToken.json written (${artifact.compiler}, ${(artifact.deployedBytecode.length - 2) / 2} bytes runtime)`);

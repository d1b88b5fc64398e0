// Builds the dashboard into dist/ (index.html, app.js, app.css), or with
// --tests the browser tests into test-build/. No timestamps, no absolute
// paths and no source maps go into dist/, so that `npm ci && npm run
// build` reproduces the committed files byte for byte.
import * as esbuild from "esbuild";
import { copyFile, mkdir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
process.chdir(here);

// The SDK's sources (../clients/typescript/src) import @bufbuild/* and
// @connectrpc/*: resolve those from ui/node_modules whatever the SDK
// folder holds, so that one copy of each is bundled and the build does
// not depend on whether the SDK's own node_modules is installed.
const sdkDeps = {
  name: "sdk-deps",
  setup(build) {
    build.onResolve({ filter: /^@(bufbuild|connectrpc)\// }, async (args) => {
      if (args.pluginData?.sdkDeps) return undefined;
      const r = await build.resolve(args.path, { kind: args.kind, resolveDir: here, pluginData: { sdkDeps: true } });
      return r.errors.length ? { errors: r.errors } : { path: r.path, sideEffects: r.sideEffects };
    });
  },
};

async function buildApp() {
  await rm("dist", { recursive: true, force: true });
  await mkdir("dist");
  await esbuild.build({
    entryPoints: { app: "src/main.ts" },
    bundle: true,
    minify: true,
    format: "iife",
    target: "es2022",
    platform: "browser",
    outdir: "dist",
    charset: "utf8",
    legalComments: "eof",
    sourcemap: false,
    logLevel: "warning",
    plugins: [sdkDeps],
  });
  await esbuild.build({
    entryPoints: { app: "src/app.css" },
    bundle: true,
    minify: true,
    outdir: "dist",
    charset: "utf8",
    logLevel: "warning",
  });
  await copyFile("src/index.html", "dist/index.html");
}

async function buildTests() {
  await rm("test-build", { recursive: true, force: true });
  const tests = (await readdir("test")).filter((f) => f.endsWith(".test.ts")).map((f) => path.join("test", f));
  await esbuild.build({
    entryPoints: tests,
    bundle: true,
    platform: "node",
    target: "node20",
    format: "esm",
    packages: "external",
    outdir: "test-build",
    outExtension: { ".js": ".mjs" },
    sourcemap: "inline",
    logLevel: "warning",
  });
}

if (process.argv.includes("--tests")) await buildTests();
else await buildApp();

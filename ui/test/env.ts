// Imported first by every test (esbuild keeps the import order): the
// harness finds bin/wardend and bin/warden from its own location, which
// is ui/test-build/ once bundled, so name them from here.
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** uiDir is ui/, whether this runs from test/ or test-build/. */
export const uiDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const repoDir = resolve(uiDir, "..");

process.env.WARDEND ??= join(repoDir, "bin/wardend");
process.env.WARDEN ??= join(repoDir, "bin/warden");

/** chromiumPath is Debian's Chromium: never a downloaded browser. */
export const chromiumPath = "/usr/bin/chromium";
export const haveChromium = existsSync(chromiumPath);

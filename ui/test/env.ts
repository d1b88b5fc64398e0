// Where the tests run from, and the browser they drive. The harness finds
// bin/wardend and bin/warden itself (the repository root above its own
// location, ui/test-build/ once bundled).
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** uiDir is ui/, whether this runs from test/ or test-build/. */
export const uiDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/** chromiumPath is Debian's Chromium: never a downloaded browser. */
export const chromiumPath = "/usr/bin/chromium";
export const haveChromium = existsSync(chromiumPath);

// Copies the console's third-party browser files from node_modules (installed by `npm ci`) into the
// Python package, where the control plane serves them at /console/assets/vendor/. Nothing is loaded
// from a CDN at run time; the copies are build output (git-ignored), rebuilt by `make console-assets`.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const target = join(here, "..", "src", "paddock_controlplane", "edge", "console", "static", "vendor");
const files = {
  "xterm.js": "@xterm/xterm/lib/xterm.js",
  "xterm.css": "@xterm/xterm/css/xterm.css",
  "addon-fit.js": "@xterm/addon-fit/lib/addon-fit.js",
};
mkdirSync(target, { recursive: true });
for (const [name, source] of Object.entries(files)) {
  copyFileSync(join(here, "node_modules", source), join(target, name));
  console.log(`console asset: ${name} <- ${source}`);
}

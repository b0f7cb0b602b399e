// Builds the run view into one self-contained HTML file: ../kernelexec/ui/run.html.
// Deterministic (same inputs, same pinned esbuild: same bytes), so CI rebuilds it and diffs the committed file.
import { build } from "esbuild";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "kernelexec", "ui", "run.html");
const bundled = await build({
  entryPoints: [join(here, "src", "view.js")],
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2020",
  platform: "browser",
  legalComments: "none",
  charset: "utf8",
  write: false,
  logLevel: "warning",
});
const js = bundled.outputFiles[0].text.replace(/<\/(script)/gi, "<\\/$1").replace(/<!--/g, "<\\!--");
const css = readFileSync(join(here, "src", "view.css"), "utf8");
const page = readFileSync(join(here, "src", "view.html"), "utf8")
  .replace("/*STYLE*/", () => css.trim())
  .replace("/*SCRIPT*/", () => js.trim());
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, page);
console.log(`wrote ${out} (${page.length.toLocaleString("en")} characters)`);

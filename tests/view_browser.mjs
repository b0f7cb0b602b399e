// The run view (an MCP App) in headless Chromium, embedded by a small test host (ui/test-host/host.js,
// ext-apps' AppBridge) whose MCP client talks to a real `kernelexec serve --transport http`.
// Run by tests/test_view_browser.py: node tests/view_browser.mjs '<json options>'.
// Options: mcp (the server's /mcp URL on 127.0.0.1), ui (the ui/ folder, with node_modules), playwright,
// shots (a directory), userDataDir. Prints one JSON object per line; the last is "done" or "error".
import { createRequire } from "node:module";
import { createServer, request } from "node:http";
import { join } from "node:path";

const opts = JSON.parse(process.argv[2]);
const require = createRequire(import.meta.url);
const { chromium } = require(opts.playwright);
const esbuild = createRequire(join(opts.ui, "package.json"))("esbuild");
const WAIT = 30_000; // every wait is bounded
const say = (step, extra = {}) => console.log(JSON.stringify({ step, ...extra }));
const overall = setTimeout(() => { say("error", { message: "driver took longer than 200 s" }); process.exit(2); }, 200_000);

// the host page, and /mcp forwarded to the kernelexec server (so the page's client is same-origin)
const hostJs = (await esbuild.build({ entryPoints: [join(opts.ui, "test-host", "host.js")], bundle: true, format: "iife",
  platform: "browser", write: false, logLevel: "warning" })).outputFiles[0].text;
const hostPage = `<!doctype html><meta charset="utf-8"><title>test host</title><body><script>${hostJs.replace(/<\/script/gi, "<\\/script")}</script>`;
const upstream = new URL(opts.mcp);
const server = createServer((req, res) => {
  if (req.url === "/" || req.url === "/index.html") {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
    return void res.end(hostPage);
  }
  if (!req.url.startsWith("/mcp")) return void res.writeHead(404).end();
  const headers = { ...req.headers, host: upstream.host };
  delete headers.origin; delete headers.referer;
  const forward = request({ host: upstream.hostname, port: upstream.port, path: upstream.pathname, method: req.method, headers }, (up) => {
    res.writeHead(up.statusCode, up.headers);
    up.pipe(res);
  });
  forward.on("error", (err) => { res.writeHead(502).end(String(err)); });
  req.pipe(forward);
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const hostUrl = `http://127.0.0.1:${server.address().port}/`;

const context = await chromium.launchPersistentContext(opts.userDataDir, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
  viewport: { width: 940, height: 1100 },
});
const offsite = [];
const consoleErrors = [];
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(WAIT);
  page.on("request", (r) => { if (!/^(http:\/\/127\.0\.0\.1[:/]|data:|blob:|about:)/.test(r.url())) offsite.push(r.url()); });
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text().slice(0, 300)); });
  await page.goto(hostUrl);
  const ready = await page.evaluate(() => window.kxReady);
  if (ready !== "ready") throw new Error(`host: ${ready}`);
  const tools = await page.evaluate(() => window.kx.tools);
  say("ready", { tools });
  const view = page.frameLocator("#view");
  scenario: { // opts.scenario "live": a run followed live and its input() answered in the view (instead of 1 and 2)
  if (opts.scenario === "live") { say("live", await live(page, view)); break scenario; }

  const opened = await page.evaluate(() => window.kx.call("new_session", {}));
  const session = opened.structuredContent.session;

  // 1. a cell that prints, plots and ends with a 45-row DataFrame
  const code = [
    "import pandas as pd, matplotlib.pyplot as plt",
    "print('hello from the kernel')",
    "fig, ax = plt.subplots(figsize=(5, 2.6)); ax.plot([i * i for i in range(20)]); ax.set_title('squares'); plt.show()",
    "df = pd.DataFrame({'n': range(45), 'square': [i * i for i in range(45)], 'label': [f'row {i}' for i in range(45)]})",
    "df",
  ].join("\n");
  const first = await page.evaluate((args) => window.kx.run(args), { code, session });
  say("ran", { ending: first.structuredContent.ending, content: first.content });
  await view.locator("#stdout").filter({ hasText: "hello from the kernel" }).waitFor();
  const stdout = await view.locator("#stdout").textContent();
  const plot = view.locator('#outputs img[data-kind="image"]').first();
  await plot.waitFor();
  const plotSize = await plot.evaluate((img) => (img.complete ? [img.naturalWidth, img.naturalHeight] : [0, 0]));
  const plotSrc = (await plot.getAttribute("src")).slice(0, 22);
  const cost = await view.locator("#cost").textContent();  // what the cell cost: its CPU seconds, the kernel's peak memory
  const rows = view.locator("#table tbody tr");
  await rows.first().waitFor();
  const firstPage = { count: await rows.count(), first: await rows.first().locator("td").allTextContents(), page: await view.locator("#page").textContent() };
  await page.screenshot({ path: join(opts.shots, "run-view.png"), fullPage: true });
  await view.locator("#next").click();
  await view.locator("#table tbody tr:first-child td.index").filter({ hasText: /^20$/ }).waitFor();
  const secondPage = { count: await rows.count(), first: await rows.first().locator("td").allTextContents(), page: await view.locator("#page").textContent() };
  await view.locator('#table th[data-col="1"]').click(); // sort by square, ascending
  await view.locator('#table th[data-col="1"]').click(); // and descending
  await view.locator('#table th[aria-sort="descending"]').waitFor();
  await view.locator("#table tbody tr:first-child td.index").filter({ hasText: /^44$/ }).waitFor();
  const sorted = await rows.first().locator("td").allTextContents();
  const variables = await view.locator("#variables tbody tr td:first-child").allTextContents();
  say("shown", { stdout, plotSize, plotSrc, cost, firstPage, secondPage, sorted, variables });

  // 2. the Interrupt button stops a running time.sleep(30)
  const t0 = Date.now();
  const running = page.evaluate((args) => window.kx.run(args), { code: "import time\ntime.sleep(30)", session });
  await view.locator("#status").filter({ hasText: "running" }).waitFor();
  await view.locator("#interrupt:not([disabled])").waitFor();
  await page.waitForTimeout(1500); // let the kernel get into the sleep
  await view.locator("#interrupt").click();
  const stopped = await running;
  const seconds = (Date.now() - t0) / 1000;
  await view.locator("#status").filter({ hasNotText: "running" }).waitFor();
  const status = await view.locator("#status").textContent();
  const error = await view.locator("#error").textContent();
  const message = await view.locator("#message").textContent();
  await page.screenshot({ path: join(opts.shots, "run-view-interrupted.png"), fullPage: true });
  say("interrupted", { seconds, ending: stopped.structuredContent.ending, success: stopped.structuredContent.success, status, error: error.slice(0, 300), message });
  } // scenario
  say("done", { offsite, consoleErrors });
} catch (err) {
  say("error", { message: String(err && err.stack || err).slice(0, 2000), offsite, consoleErrors });
} finally {
  clearTimeout(overall);
  await context.close();
  server.closeAllConnections();
  server.close();
  process.exit(0); // kept-alive forwarding sockets would hold the loop open
}

// The server runs with a short --yield-after: the call answers "running" at once and the view follows the run
// with get_run (its output appears while it runs), shows a text field when the code waits in input(), and
// sends what is typed there with send_input.
async function live(page, view) {
  const opened = await page.evaluate(() => window.kx.call("new_session", {}));
  const session = opened.structuredContent.session;
  await page.evaluate(() => window.kx.call("execute_code", { code: "0" }));
  const code = [
    "import time",
    "for i in range(1, 7):",
    "    print(f'tick {i}', flush=True)",
    "    time.sleep(1)",
    "name = input('Your name? ')",
    "print('hello', name)",
    "result = 'hi ' + name",
  ].join("\n");
  const first = await page.evaluate((args) => window.kx.run(args), { code, session });
  await view.locator("#stdout").filter({ hasText: "tick 2" }).waitFor();
  const whileRunning = { status: await view.locator("#status").textContent(), stdout: await view.locator("#stdout").textContent() };
  await view.locator("#input-section:not([hidden])").waitFor();
  const asked = { status: await view.locator("#status").textContent(), prompt: await view.locator("#input-prompt").textContent(),
    who: await view.locator("#input-who").textContent(), stdout: await view.locator("#stdout").textContent() };
  await page.screenshot({ path: join(opts.shots, "run-view-input.png"), fullPage: true });
  await view.locator("#input-text").fill("Ada");
  await view.locator("#input-send").click();
  await view.locator("#status").filter({ hasText: /^ok$/ }).waitFor();
  const done = { status: await view.locator("#status").textContent(), result: await view.locator("#result").textContent(),
    stdout: await view.locator("#stdout").textContent(), inputHidden: await view.locator("#input-section").isHidden() };
  await page.screenshot({ path: join(opts.shots, "run-view-live-done.png"), fullPage: true });
  return { firstEnding: first.structuredContent.ending, whileRunning, asked, done };
}

// Drives real JupyterLab (started by `kernelexec lab`) in headless Chromium, as a user would.
// Run by tests/test_lab_browser.py: node tests/lab_browser.mjs '<json options>'.
// After steps 1 and 4 it waits for a line on stdin (the test plants the attack, then restarts the session).
// Options: url (with token), handle, display (the kernel's display name), shots (a directory),
// userDataDir, playwright (path to the playwright-core package). Prints one JSON object per line:
// {"step": ..., ...}; the last line is {"step": "done", ...} or {"step": "error", "message": ...}.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const opts = JSON.parse(process.argv[2]);
const require = createRequire(import.meta.url);
const { chromium } = require(opts.playwright);
const WAIT = 60_000; // every wait is bounded (generous: a loaded 2-core CI machine starts Lab slowly)
const say = (step, extra = {}) => console.log(JSON.stringify({ step, ...extra }));
const stdinLines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function waitForGo() { // the test plants the kernel's hook, then writes a line
  const next = await Promise.race([stdinLines.next(), new Promise((r) => setTimeout(() => r({ done: true }), WAIT))]);
  if (next.done) throw new Error("no go-ahead from the test");
}
const overall = setTimeout(() => { say("error", { message: "driver took longer than 240 s" }); process.exit(2); }, 240_000);

const context = await chromium.launchPersistentContext(opts.userDataDir, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
  viewport: { width: 1400, height: 860 },
});
const terminalRequests = [];
const restartAnswers = [];
const cspErrors = [];
const dialogs = [];
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(WAIT);
  page.on("request", (r) => { if (r.url().includes("/terminals")) terminalRequests.push(`${r.method()} ${r.url()}`); });
  page.on("console", (m) => { if (/Content Security Policy/i.test(m.text())) cspErrors.push(m.text().slice(0, 300)); });
  page.on("response", async (r) => {
    if (r.url().includes("/restart")) restartAnswers.push({ status: r.status(), body: await r.text().catch(() => "") });
  });
  page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss().catch(() => {}); });

  await page.goto(opts.url);
  await page.locator(".jp-Launcher").first().waitFor();
  say("lab loaded", { title: await page.title(), address: page.url() });

  // The session's kernel is offered in the Launcher, under Console, by its display name.
  const card = page.locator('.jp-LauncherCard[data-category="Console"]', { hasText: opts.display });
  await card.first().waitFor();
  const consoleCards = await page.locator('.jp-LauncherCard[data-category="Console"]').allInnerTexts();
  const notebookCards = await page.locator('.jp-LauncherCard[data-category="Notebook"]').allInnerTexts();
  say("launcher", { consoleCards, notebookCards });
  await card.first().click();

  const input = page.locator(".jp-CodeConsole-input .cm-content").first();
  await input.waitFor();
  const outputs = page.locator(".jp-CodeConsole-content .jp-OutputArea-output");
  // Lab's console ignores Shift+Enter until its kernel connection is ready (the code stays in the prompt), which a
  // loaded machine can take long to reach: while the code is still in the prompt, Shift+Enter again.
  async function run(code, expectCount) {
    await input.click();
    await page.keyboard.type(code);
    await page.keyboard.press("Shift+Enter");
    const enough = (n) => document.querySelectorAll(".jp-CodeConsole-content .jp-OutputArea-output").length >= n;
    const deadline = Date.now() + WAIT;
    for (;;) {
      const shown = await page.waitForFunction(enough, expectCount, { timeout: 5_000 }).then(() => true, () => false);
      if (shown) break;
      if (Date.now() > deadline) throw new Error(`no output for ${JSON.stringify(code)} within ${WAIT} ms`);
      if ((await input.innerText()).trim() === code) {
        await input.click();
        await page.keyboard.press("Shift+Enter");
      }
    }
    await page.waitForFunction(() => !document.querySelector(".jp-CodeConsole-content .jp-InputPrompt")?.innerText.includes("*"),
      null, { timeout: WAIT }).catch(() => {});
  }

  // 1. The agent's variable, evaluated from Lab.
  await run("shared", 1);
  const first = await outputs.allInnerTexts();
  // the Running panel: where the session's kernel (and this console) appear
  await page.locator('.lm-TabBar-tab[data-id="jp-running-sessions"]').click();
  await page.locator(".jp-RunningSessions").first().waitFor();
  await page.waitForTimeout(1000);
  const running = await page.locator(".jp-RunningSessions").first().innerText();
  await page.screenshot({ path: `${opts.shots}/lab.png` });
  say("evaluated", { outputs: first, running });
  await waitForGo();

  // 2. The attack: the kernel planted a post_run_cell hook; the user runs one cell with Shift+Enter.
  const before = await outputs.count();
  await run("1 + 1", before + 2);
  await page.waitForTimeout(3000); // time for any script to open a terminal and run its command
  const after = await outputs.allInnerTexts();
  const pwned = await page.evaluate(() => window.__kernelexec_pwned === true);
  const scripts = await page.evaluate(() => document.querySelectorAll(".jp-CodeConsole-content script").length);
  await page.screenshot({ path: `${opts.shots}/attack.png` });
  say("attack", { outputs: after.slice(before), pwned, scripts, terminalRequests, dialogs });

  // 3. The session's notebook, opened from the file browser: on the session's kernel.
  await page.locator('.lm-TabBar-tab[data-id="filebrowser"]').click();
  const folder = page.locator(".jp-DirListing-item", { hasText: opts.handle }).first();
  await folder.waitFor();
  const top = await page.locator(".jp-DirListing-itemName").allInnerTexts();
  await folder.dblclick();
  const nbItem = page.locator(".jp-DirListing-item", { hasText: "notebook.ipynb" }).first();
  await nbItem.waitFor();
  const inside = await page.locator(".jp-DirListing-itemName").allInnerTexts();
  await nbItem.dblclick();
  const kernelName = page.locator(".jp-NotebookPanel .jp-Toolbar-kernelName").first();
  await kernelName.waitFor();
  await page.waitForFunction((d) => [...document.querySelectorAll(".jp-NotebookPanel .jp-Toolbar-kernelName")]
    .some((e) => e.innerText.includes(d)), opts.display, { timeout: WAIT });
  await page.waitForFunction(() => document.querySelectorAll(".jp-NotebookPanel .jp-Cell").length > 0, null, { timeout: WAIT });
  const cells = await page.locator(".jp-NotebookPanel .jp-Cell").count();
  const sessions = await page.evaluate(async () => {
    const xsrf = document.cookie.split("; ").find((c) => c.startsWith("_xsrf="))?.slice(6) ?? "";
    const r = await fetch("/api/sessions", { headers: { "X-XSRFToken": xsrf } });
    return r.json();
  });
  await page.screenshot({ path: `${opts.shots}/notebook.png` });
  say("notebook", { kernelName: await kernelName.innerText(), cells, top, inside, sessions, dialogs, terminalRequests });

  // 4. "Restart Kernel" from Lab's Kernel menu, on the console: the session restarts its kernel, and Lab stays on it.
  await page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", { hasText: "Console 1" }).first().click();
  await page.locator(".lm-MenuBar-item", { hasText: "Kernel" }).first().click();
  await page.locator(".lm-Menu-item", { hasText: "Restart Kernel…" }).first().click();
  await page.locator(".jp-Dialog .jp-mod-accept").first().click(); // "Restart"
  const told = [];
  for (let i = 0; i < 20; i++) { // up to 5 s of dialogs
    await page.waitForTimeout(250);
    const dialog = page.locator(".jp-Dialog").first();
    if (await dialog.count()) {
      told.push(await dialog.innerText());
      await page.locator(".jp-Dialog .jp-mod-accept, .jp-Dialog .jp-mod-reject").first().click();
    }
  }
  const status = await page.locator(".jp-CodeConsole .jp-Toolbar-kernelStatus, .jp-StatusBar-TextItem", { hasText: "|" })
    .first().innerText().catch(() => "");
  const countBefore = await outputs.count();
  await run("shared", countBefore + 1);
  const afterRestart = (await outputs.allInnerTexts()).slice(countBefore);
  await page.screenshot({ path: `${opts.shots}/restart.png` });
  say("restart", { told, status, outputs: afterRestart, answers: restartAnswers });

  // 5. The agent calls restart_session (the test does it now): the console stays on the kernel id and
  // reaches the session's new kernel.
  await waitForGo();
  const seen = [];
  for (let i = 0; i < 16; i++) { // up to 4 s: what Lab says about it
    await page.waitForTimeout(250);
    const dialog = page.locator(".jp-Dialog").first();
    if (await dialog.count()) {
      seen.push(await dialog.innerText());
      await page.locator(".jp-Dialog .jp-mod-accept, .jp-Dialog .jp-mod-reject").first().click();
    }
  }
  const statuses = [];
  for (let i = 0; i < 60; i++) { // up to 30 s for Lab to reconnect (a loaded CI machine)
    const text = (await page.locator(".jp-StatusBar-TextItem", { hasText: "|" }).allInnerTexts()).join(" ");
    if (statuses[statuses.length - 1] !== text) statuses.push(text);
    if (text.endsWith("| Idle")) break;
    await page.waitForTimeout(500);
  }
  await page.screenshot({ path: `${opts.shots}/agent-restart.png` });
  say("agent restart status", { statuses });
  const n = await outputs.count();
  await run("after", n + 1);
  say("agent restart", { told: seen, outputs: (await outputs.allInnerTexts()).slice(n) });
  say("done", { cspErrors, terminalRequests });
} catch (err) {
  say("error", { message: String(err && err.stack || err), terminalRequests, dialogs });
  process.exitCode = 1;
} finally {
  clearTimeout(overall);
  await context.close();
  process.exit(process.exitCode ?? 0); // stdin (the go-ahead line) would keep node waiting
}

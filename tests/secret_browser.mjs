// A human at a getpass() page (kernelexec/server/secret_page.py) in headless Chromium: opens the URL a URL-mode
// elicitation gave (after a link preview's GET), reads the page, tries a forged POST, types the secret, submits, and
// tries the URL again.
// Run by tests/test_secret_page.py: node tests/secret_browser.mjs '<json options>'.
// Options: url, secret, playwright, userDataDir, shots (a directory, optional). Prints one JSON object per line;
// the last is "done" or "error".
import { createRequire } from "node:module";
import { join } from "node:path";

const opts = JSON.parse(process.argv[2]);
const { chromium } = createRequire(import.meta.url)(opts.playwright);
const say = (step, extra = {}) => console.log(JSON.stringify({ step, ...extra }));
const overall = setTimeout(() => { say("error", { message: "driver took longer than 100 s" }); process.exit(2); }, 100_000);

const context = await chromium.launchPersistentContext(opts.userDataDir, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
});
const requests = [];
const consoleErrors = [];
try {
  const page = await context.newPage();
  page.on("request", (r) => requests.push(`${r.method()} ${r.url()}`));
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  // a chat client's link preview fetches the URL first (a plain GET, another agent): it must not use the page up
  const preview = await fetch(opts.url, { headers: { "User-Agent": "Slackbot-LinkExpanding 1.0" } });
  const previewText = await preview.text();
  say("preview", { status: preview.status, form: previewText.includes("name=secret") });
  const opened = await page.goto(opts.url, { timeout: 30_000 });
  const headers = opened.headers();
  say("opened", {
    status: opened.status(), headers, title: await page.title(), text: await page.locator("body").innerText(),
    scripts: await page.locator("script").count(), framable: headers["x-frame-options"] !== "DENY",
  });
  if (opts.shots) await page.screenshot({ path: join(opts.shots, "secret-page.png") });
  // a forged POST (the right URL, not the form's token): refused, nothing answered
  const forged = await context.request.post(opts.url, { form: { token: "forged", secret: "not-the-secret" }, failOnStatusCode: false });
  say("forged", { status: forged.status() });
  await page.locator("input[name=secret]").fill(opts.secret);
  const [sent] = await Promise.all([page.waitForNavigation({ timeout: 30_000 }), page.locator("button[type=submit]").click()]);
  say("sent", { status: sent ? sent.status() : null, text: await page.locator("body").innerText() });
  let again;
  try {
    const second = await context.request.get(opts.url, { failOnStatusCode: false, timeout: 10_000 });
    again = { status: second.status() };
  } catch (err) {
    again = { status: null, refused: String(err).slice(0, 200) }; // stdio: the page's listener is closed
  }
  say("again", again);
  say("done", { requests, consoleErrors });
} catch (err) {
  say("error", { message: String(err && err.stack || err) });
} finally {
  clearTimeout(overall);
  await context.close();
}

// The kernelexec run view: an MCP App (ext-apps App SDK) shown by hosts next to execute_code / get_run.
// It reaches the server only through the host (App.callServerTool / readServerResource), and the kernel
// only through the app-only tools view_table, view_variables, view_interrupt and view_restart. A run still
// going (ending "running"/"awaiting_input") is followed live with get_run; its input() is answered with send_input.
// Every kernel-made string goes in through textContent; SVG only as an <img>; HTML only in a sandboxed frame.
import { App } from "@modelcontextprotocol/ext-apps";

const PAGE_SIZE = 20;
const FOLLOW_WAIT_S = 2; // each get_run waits this long for the run: the output refreshes at least this often
const $ = (id) => document.getElementById(id);
const state = { session: null, code: "", result: null, running: false, tables: [], table: null, page: 0, sort: null, descending: false,
  following: null };
const app = new App({ name: "kernelexec-run-view", version: "0.1.0" }, {});

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function show(id, text) {
  const has = typeof text === "string" && text.length > 0;
  $(`${id}-section`).hidden = !has;
  $(id).textContent = has ? text : "";
}

function message(text) {
  $("message").hidden = !text;
  $("message").textContent = text || "";
}

function statusOf(s) {
  if (s && s.ending === "awaiting_input") return "input";
  if (state.running) return "running";
  if (!s) return "waiting";
  if (s.ending === "running") return "running";
  if (s.success) return "ok";
  return s.ending === "completed" ? "error" : s.ending;
}

async function call(name, args) {
  const result = await app.callServerTool({ name, arguments: args });
  if (result.isError) throw new Error((result.content || []).map((c) => c.text || "").join(" ") || `${name} failed`);
  return result.structuredContent || {};
}

function render() {
  const s = state.result && state.result.structuredContent;
  const status = statusOf(s);
  $("status").textContent = status;
  $("status").dataset.status = status;
  const bits = [];
  if (s && s.execution_count != null) bits.push(`cell ${s.execution_count}`);
  if (s && typeof s.duration_ms === "number") bits.push(`${(s.duration_ms / 1000).toFixed(2)} s`);
  if (state.session) bits.push(`session ${state.session}`);
  $("timing").textContent = bits.join(" \u00b7 ");
  const cost = [];  // what the cell cost in the kernel: its own CPU seconds, the kernel's peak memory
  if (s && typeof s.cpu_seconds === "number") cost.push(`CPU ${s.cpu_seconds.toFixed(2)} s`);
  if (s && typeof s.peak_memory_mb === "number") cost.push(`peak ${Math.round(s.peak_memory_mb)} MB`);
  $("cost").textContent = cost.join(" \u00b7 ");
  $("interrupt").disabled = !(state.running && state.session);
  $("restart").disabled = !state.session;
  show("code", state.code);
  show("result", s && s.result != null ? (typeof s.result === "string" ? s.result : JSON.stringify(s.result, null, 1)) : "");
  show("stdout", s ? s.stdout : "");
  show("stderr", s ? s.stderr : "");
  show("error", s && s.error ? [s.error, ...(s.traceback || []).slice(-30)].join("\n") : "");
  const asking = s && s.ending === "awaiting_input" && s.run_id;
  $("input-section").hidden = !asking;
  if (asking) {
    $("input-who").textContent = `The code running in session ${s.session} asks through ${s.input_password ? "getpass()" : "input()"} ` +
      "(the question is the code's, not the assistant's):";
    $("input-prompt").textContent = s.input_prompt || "(no prompt)";
    $("input-text").type = s.input_password ? "password" : "text";
  }
}

// Rich outputs: images from the answer's image blocks; the files of outputs without one (SVG, HTML)
// read through the host as resources. Grouped by output (cellN-M-outK.*).
async function renderOutputs() {
  const box = $("outputs");
  box.replaceChildren();
  const result = state.result;
  const s = result && result.structuredContent;
  if (!s) return void ($("outputs-section").hidden = true);
  for (const block of result.content || []) {
    if (block.type === "image" && /^image\/(png|jpeg)$/.test(block.mimeType || "")) {
      box.append(el("img", { src: `data:${block.mimeType};base64,${block.data}`, alt: "plot", "data-kind": "image" }));
    }
  }
  const groups = new Map();
  for (const ref of s.outputs || []) {
    const stem = (ref.uri || "").replace(/\.[^./]+$/, "");
    if (!groups.has(stem)) groups.set(stem, []);
    groups.get(stem).push(ref);
  }
  const dataframes = state.tables.length > 0;
  for (const refs of groups.values()) {
    if (refs.some((r) => /^image\/(png|jpeg)$/.test(r.mime_type))) continue; // shown from its image block
    const svg = refs.find((r) => r.mime_type === "image/svg+xml");
    const html = refs.find((r) => r.mime_type === "text/html");
    try {
      if (svg) {
        const text = await readText(svg.uri);
        box.append(el("img", { src: URL.createObjectURL(new Blob([text], { type: "image/svg+xml" })), alt: "SVG output", "data-kind": "svg" }));
      } else if (html) {
        const text = await readText(html.uri);
        if (dataframes && /class="dataframe/.test(text)) continue; // the paged table below shows it
        const frame = el("iframe", { sandbox: "", title: "HTML output", "data-kind": "html", referrerpolicy: "no-referrer" });
        frame.srcdoc = `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">${text}`;
        box.append(frame);
      } else {
        for (const r of refs) box.append(el("div", { class: "link" }, `${r.mime_type} (${r.size.toLocaleString()} bytes): ${r.uri}`));
      }
    } catch (err) {
      for (const r of refs) box.append(el("div", { class: "link" }, `${r.mime_type}: ${r.uri} (${err.message || err})`));
    }
  }
  $("outputs-section").hidden = box.childElementCount === 0;
}

async function readText(uri) {
  const read = await app.readServerResource({ uri });
  const item = (read.contents || [])[0] || {};
  if (typeof item.text === "string") return item.text;
  if (typeof item.blob === "string") return new TextDecoder().decode(Uint8Array.from(atob(item.blob), (c) => c.charCodeAt(0)));
  throw new Error("empty resource");
}

async function refreshVariables() {
  if (!state.session || state.running) return;
  let found;
  try {
    found = await call("view_variables", { session: state.session });
  } catch (err) {
    message(`variables: ${err.message || err}`);
    return;
  }
  const rows = $("variables").tBodies[0];
  rows.replaceChildren();
  const variables = found.variables || [];
  for (const v of variables) {
    const tr = el("tr");
    tr.append(el("td", {}, v.name), el("td", {}, v.type), el("td", {}, v.shape ? v.shape.join("\u00d7") : v.length != null ? String(v.length) : ""),
      el("td", {}, (v.repr || "").split("\n")[0].slice(0, 80)));
    rows.append(tr);
  }
  $("variables-section").hidden = variables.length === 0;
  state.tables = variables.filter((v) => /DataFrame$/.test(v.type)).map((v) => v.name);
  const select = $("table-name");
  select.replaceChildren(...state.tables.map((name) => el("option", { value: name }, name)));
  if (state.tables.length === 0) {
    $("table-section").hidden = true;
    return;
  }
  // the DataFrame the cell ends with, if it ends with one; else the one shown before; else the first
  const last = state.code.trim().split("\n").pop().trim();
  const pick = state.tables.includes(last) ? last : state.tables.includes(state.table) ? state.table : state.tables[0];
  if (pick !== state.table) Object.assign(state, { table: pick, page: 0, sort: null, descending: false });
  select.value = pick;
  await loadPage();
  if (pick === last && !$("table-section").hidden) $("result-section").hidden = true; // the table shows it
}

async function loadPage() {
  const args = { session: state.session, name: state.table, page: state.page, page_size: PAGE_SIZE, descending: state.descending };
  if (state.sort != null) args.sort_column = state.sort;
  let page;
  try {
    page = await call("view_table", args);
  } catch (err) {
    message(`table: ${err.message || err}`);
    return;
  }
  message("");
  const head = el("tr");
  head.append(el("th", {}, page.index_name || ""));
  page.columns.forEach((name, i) => {
    const th = el("th", { "data-col": String(i), title: "Sort by this column" }, name);
    if (page.sort_column === i) th.setAttribute("aria-sort", page.descending ? "descending" : "ascending");
    th.addEventListener("click", () => {
      state.descending = state.sort === i ? !state.descending : false;
      state.sort = i;
      state.page = 0;
      loadPage();
    });
    head.append(th);
  });
  $("table").tHead.replaceChildren(head);
  const body = $("table").tBodies[0];
  body.replaceChildren(...page.rows.map((row) => {
    const tr = el("tr");
    row.forEach((cell, i) => tr.append(el("td", i === 0 ? { class: "index" } : {}, cell)));
    return tr;
  }));
  $("page").textContent = `page ${page.page + 1} of ${page.pages} (${page.total_rows.toLocaleString()} rows)`;
  $("prev").disabled = page.page <= 0;
  $("next").disabled = page.page + 1 >= page.pages;
  $("table-section").hidden = false;
}

async function showResult(result, following = false) {
  state.result = result;
  const s = result.structuredContent || {};
  state.running = s.ending === "running" || s.ending === "awaiting_input";
  if (s.session) state.session = s.session;
  render();
  if (state.running && s.run_id) {
    if (!following) follow(s.run_id);
    return;
  }
  await refreshVariables();
  await renderOutputs();
}

// A run still going: get_run, again and again, shows its output so far until it ends or asks for input
// (then the text field answers it through send_input, and following starts again).
async function follow(runId) {
  if (state.following === runId) return;
  state.following = runId;
  try {
    while (state.following === runId) {
      const s = (state.result && state.result.structuredContent) || {};
      if (s.run_id !== runId || s.ending !== "running") return;
      const result = await app.callServerTool({ name: "get_run", arguments: { run_id: runId, wait_s: FOLLOW_WAIT_S } });
      if (result.isError) throw new Error((result.content || []).map((c) => c.text || "").join(" ") || "get_run failed");
      if (state.following !== runId) return;
      await showResult(result, true);
    }
  } catch (err) {
    message(`following run ${runId}: ${err.message || err}`);
  } finally {
    if (state.following === runId) state.following = null;
  }
}

async function answer(text) {
  const s = (state.result && state.result.structuredContent) || {};
  if (!s.run_id) return;
  $("input-send").disabled = $("input-decline").disabled = true;
  try {
    // the answer names the question it answers: the one this view shows (a later question is refused it)
    const asked = { run_id: s.run_id, question_id: s.question_id, wait_s: 0 };
    const args = text === null ? { ...asked, cancel: true } : { ...asked, text };
    const result = await app.callServerTool({ name: "send_input", arguments: args });
    if (result.isError) throw new Error((result.content || []).map((c) => c.text || "").join(" ") || "send_input failed");
    $("input-text").value = "";
    await showResult(result);
  } catch (err) {
    message(`input: ${err.message || err}`);
  } finally {
    $("input-send").disabled = $("input-decline").disabled = false;
  }
}

app.ontoolinput = (params) => {
  const args = params.arguments || {};
  if (typeof args.code === "string") state.code = args.code;
  if (typeof args.session === "string") state.session = args.session;
  state.following = null; // a new call: stop following the last run
  state.running = true;
  state.result = null;
  render();
};
app.ontoolresult = (result) => {
  showResult(result).catch((err) => message(String(err.message || err)));
};
app.ontoolcancelled = () => {
  state.running = false;
  render();
};

$("interrupt").addEventListener("click", async () => {
  $("interrupt").disabled = true;
  try {
    const info = await call("view_interrupt", { session: state.session });
    message(info.status);
  } catch (err) {
    message(`interrupt: ${err.message || err}`);
  }
});
$("restart").addEventListener("click", async () => {
  $("restart").disabled = true;
  try {
    const info = await call("view_restart", { session: state.session });
    message(`kernel ${info.status}: variables cleared`);
    state.table = null;
    await refreshVariables();
  } catch (err) {
    message(`restart: ${err.message || err}`);
  } finally {
    render();
  }
});
$("input-send").addEventListener("click", () => answer($("input-text").value));
$("input-text").addEventListener("keydown", (event) => { if (event.key === "Enter") answer($("input-text").value); });
$("input-decline").addEventListener("click", () => answer(null));
$("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); loadPage(); });
$("next").addEventListener("click", () => { state.page += 1; loadPage(); });
$("table-name").addEventListener("change", (event) => {
  Object.assign(state, { table: event.target.value, page: 0, sort: null, descending: false });
  loadPage();
});

render();
app.connect().catch((err) => message(`could not connect to the host: ${err.message || err}`));

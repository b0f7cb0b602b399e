// A minimal MCP Apps host for tests/view_browser.mjs (bundled at test time, never shipped): an MCP client
// that negotiates the Apps extension with a real kernelexec server (through the page's own /mcp, which
// the test's little server forwards to `kernelexec serve --transport http`), the run view read as a
// ui:// resource and embedded in a sandboxed iframe, and ext-apps' AppBridge between the two, which
// forwards the view's tools/call and resources/read to the server.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

const APPS = "io.modelcontextprotocol/ui";
const MIME = "text/html;profile=mcp-app";
const log = [];
window.kxLog = log;

async function start() {
  const client = new Client({ name: "kernelexec-test-host", version: "0.1.0" },
    { capabilities: { extensions: { [APPS]: { mimeTypes: [MIME] } } } });
  await client.connect(new StreamableHTTPClientTransport(new URL("/mcp", location.href)));
  const tools = (await client.listTools()).tools;
  const execute = tools.find((t) => t.name === "execute_code");
  const uri = execute && execute._meta && execute._meta.ui && execute._meta.ui.resourceUri;
  if (!uri) throw new Error("execute_code carries no _meta.ui.resourceUri");
  const read = await client.readResource({ uri });
  const resource = read.contents[0];
  if (resource.mimeType !== MIME) throw new Error(`the view is served as ${resource.mimeType}`);

  const frame = document.createElement("iframe");
  frame.id = "view";
  frame.setAttribute("sandbox", "allow-scripts"); // an opaque origin: no cookies, no storage, no same-origin access
  frame.style.cssText = "width: 900px; height: 1040px; border: 1px solid #ccc";
  document.body.append(frame);
  const bridge = new AppBridge(client, { name: "kernelexec-test-host", version: "0.1.0" },
    { serverTools: {}, serverResources: {}, logging: {} });
  bridge.onloggingmessage = (m) => log.push(m);
  const initialized = new Promise((resolve) => { bridge.oninitialized = resolve; });
  await bridge.connect(new PostMessageTransport(frame.contentWindow, frame.contentWindow));
  frame.srcdoc = resource.text;
  await initialized;

  window.kx = {
    tools: tools.map((t) => ({ name: t.name, visibility: t._meta && t._meta.ui && t._meta.ui.visibility })),
    async call(name, args) {
      return await client.callTool({ name, arguments: args });
    },
    // what a host does for a UI-bound tool: the input to the view, the call, the result to the view
    async run(args) {
      await bridge.sendToolInput({ arguments: args });
      const result = await client.callTool({ name: "execute_code", arguments: args }, undefined, { timeout: 120_000 });
      await bridge.sendToolResult(result);
      return { structuredContent: result.structuredContent, content: result.content.map((c) => c.type) };
    },
  };
}

window.kxReady = start().then(() => "ready", (err) => `failed: ${err && err.stack || err}`);

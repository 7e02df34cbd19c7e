// An MCP client built on the official Tasks package (@modelcontextprotocol/ext-tasks) and
// the official TypeScript client SDK, driven by tests/it/tasks.rs against emisar.
//
// Each step prints one JSON line on stdout, so the test can act between steps (approve a
// request in the portal) and read what the client saw.
//
//   node mcp_tasks_client.mjs '{"mode": "settle", "url": A, "pollUrl": B, "token": T,
//                               "tool": NAME, "args": {...}}'
//     calls NAME through replica A, prints {"step": "task", ...}, detaches, resumes the
//     task through replica B and prints {"step": "outcome", ...} once it settles;
//   mode "cancel": calls, prints the task, cancels it with tasks/cancel, prints
//     {"step": "cancelled", "task": tasks/get after the cancel};
//   mode "create": calls, prints the task, and leaves it be;
//   mode "probe" (with "taskId"): tasks/get, tasks/update (no responses) and tasks/cancel
//     of that id, printing {"step": "probe", "get", "update", "cancel"}, each {"ok": …} or
//     {"error": …}.

import { join } from "node:path";
import { pathToFileURL } from "node:url";

const opts = JSON.parse(process.argv[2]);
// The packages live under the test tools' node_modules (scripts/install-test-deps), which
// ESM resolution from this file does not search: "nodeModules" says where.
const load = (path) => import(pathToFileURL(join(opts.nodeModules, path)).href);
const { Client, StreamableHTTPClientTransport } = await load(
  "@modelcontextprotocol/client/dist/index.mjs",
);
const { createTaskSessionFromClient, resultFromTaskOutcome } = await load(
  "@modelcontextprotocol/ext-tasks/dist/client/index.js",
);

const PROTOCOL = "2026-07-28";
const CLIENT_INFO = { name: "emisar-tasks-test", version: "1.0.0" };
// One logical server behind both replicas: a task reference from one is valid at the other.
const ENDPOINT = "emisar-under-test";

const print = (line) => process.stdout.write(JSON.stringify(line) + "\n");

/** Sends one JSON-RPC request to `url` as a 2026-07-28 client does, answering the
 * package's {kind, result | error}. */
function rawDispatchTo(url, token) {
  let next = 0;
  return async (request, options = {}) => {
    const message = { jsonrpc: "2.0", id: `tasks-${++next}`, ...request };
    const headers = {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": PROTOCOL,
      "mcp-method": message.method,
    };
    // SEP-2243: the name a request acts on goes in a header too: the tool, or the task.
    if (message.method === "tools/call") headers["mcp-name"] = message.params.name;
    if (message.method.startsWith("tasks/")) headers["mcp-name"] = message.params.taskId;
    const response = await fetch(url, {
      method: "POST",
      headers,
      body: JSON.stringify(message),
      signal: options.signal,
    });
    const answer = parseAnswer(await response.text(), message.id);
    if (answer === undefined) {
      throw new Error(`no answer to ${message.method} (HTTP ${response.status})`);
    }
    return answer.error !== undefined
      ? { kind: "error", error: answer.error }
      : { kind: "result", result: answer.result };
  };
}

/** The JSON-RPC answer with `id` in a JSON body or an SSE stream. */
function parseAnswer(body, id) {
  const candidates = body.trimStart().startsWith("{")
    ? [body]
    : body
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trim())
        .filter((data) => data.startsWith("{"));
  for (const text of candidates) {
    const message = JSON.parse(text);
    if (message.id === id) return message;
  }
  return undefined;
}

async function session(url, token) {
  const client = new Client(CLIENT_INFO, {
    capabilities: { extensions: { "io.modelcontextprotocol/tasks": {} } },
    versionNegotiation: { mode: { pin: PROTOCOL } },
  });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return createTaskSessionFromClient(client, {
    endpointId: ENDPOINT,
    rawDispatch: rawDispatchTo(url, token),
    v2RequestFraming: {
      protocolVersion: PROTOCOL,
      clientInfo: CLIENT_INFO,
      clientCapabilities: { extensions: { "io.modelcontextprotocol/tasks": {} } },
    },
  });
}

/** The task view the package made of the server's answer, in the wire's names. */
const shown = (view) => ({
  taskId: view.taskId,
  status: view.status,
  statusMessage: view.statusMessage,
  pollIntervalMs: view.suggestedPollIntervalMs,
});

async function outcomeOf(promise) {
  try {
    return { ok: await promise };
  } catch (error) {
    return { error: { name: error.name, code: error.code, message: error.message } };
  }
}

/** Releases `execution` without cancelling its task, then closes `session`. The package
 * untracks a detached execution only once its result settles (a later tick), and closing a
 * session cancels every execution it still tracks. */
async function leave(execution, session) {
  await execution.detach();
  await execution.result().catch(() => {});
  await new Promise((resolve) => setImmediate(resolve));
  await session.close();
}

async function callForTask(url) {
  const requester = await session(url, opts.token);
  const execution = await requester.callTool(opts.tool, opts.args, {
    task: { preference: "require" },
  });
  if (execution.kind !== "task") {
    throw new Error(`expected a task, got an immediate answer: ${JSON.stringify(await execution.result())}`);
  }
  const view = await requester.task(execution.handle.taskId).snapshot();
  print({ step: "task", ...shown(view) });
  return { requester, execution };
}

if (opts.mode === "settle") {
  const { requester, execution } = await callForTask(opts.url);
  const reference = execution.serializeReference();
  await leave(execution, requester);
  // A new client, another replica: only the reference carries over.
  const poller = await session(opts.pollUrl, opts.token);
  const resumed = await poller.resumeTask(reference);
  const { outcome, lastTask } = await resumed.settle();
  print({
    step: "outcome",
    status: outcome.status,
    result: outcome.status === "completed" ? resultFromTaskOutcome(outcome) : undefined,
    error: outcome.status === "failed" ? { message: outcome.error.message } : undefined,
    lastTask: lastTask === undefined ? undefined : shown(lastTask),
  });
  await poller.close();
} else if (opts.mode === "cancel") {
  const { requester, execution } = await callForTask(opts.url);
  await requester.cancelTask(execution.handle.taskId);
  const view = await requester.task(execution.handle.taskId).snapshot();
  print({ step: "cancelled", task: shown(view) });
  await leave(execution, requester);
} else if (opts.mode === "create") {
  const { requester, execution } = await callForTask(opts.url);
  await leave(execution, requester);
} else if (opts.mode === "probe") {
  const other = await session(opts.url, opts.token);
  const controller = other.task(opts.taskId);
  const get = await outcomeOf(controller.snapshot().then(shown));
  const update = await outcomeOf(controller.update({}).then(() => "acknowledged"));
  const cancel = await outcomeOf(controller.cancel().then(() => "acknowledged"));
  print({ step: "probe", get, update, cancel });
  await other.close();
} else {
  throw new Error(`unknown mode ${opts.mode}`);
}

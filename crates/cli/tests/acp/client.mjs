// An ACP client built on the official TypeScript SDK (@agentclientprotocol/sdk, pinned in
// package-lock.json), driving `keel acp` the way an editor does. Run from
// crates/cli/tests/suite/acp_e2e/harness.rs; prints one JSON object (what it saw) on stdout.
//
//   node client.mjs SCENARIO
//
// Environment: KEEL_ACP_CLIENT_DIR (the folder with node_modules), KEEL_BIN, KEEL_ARGS (a
// JSON array of arguments after `acp`), ACP_CWD (the session's cwd), ACP_SESSION (for
// `load`), ACP_MCP (a JSON array: session/new's mcpServers), ACP_POLICY (`by-path`: reject a write whose path contains "denied", allow the
// rest; `reject-all`: reject_always everything).
//
// Scenarios:
//   turns  initialize; session/new; a turn that writes two files (one approved, one
//          denied); a turn whose command is cancelled mid-tool, and a prompt sent while
//          it runs (queued into it, answered unjoined since the turn is cancelled).
//   queue  initialize; session/new; a turn whose command runs a moment, and a second
//          prompt sent meanwhile (queued: it joins the running turn); both answers.
//   load   initialize; session/list; session/load of ACP_SESSION (the replay).
//   one    initialize; session/new; one turn ("do it").
import { spawn } from "node:child_process";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const scenario = process.argv[2];
const dir = process.env.KEEL_ACP_CLIENT_DIR;
const acp = await import(
  pathToFileURL(join(dir, "node_modules/@agentclientprotocol/sdk/dist/v1/stable/acp.js")).href
);

const agent = spawn(process.env.KEEL_BIN, ["acp", ...JSON.parse(process.env.KEEL_ARGS)], {
  stdio: ["pipe", "pipe", "inherit"],
});
const exited = new Promise((resolve) => agent.on("exit", (code) => resolve(code)));
const stream = acp.ndJsonStream(Writable.toWeb(agent.stdin), Readable.toWeb(agent.stdout));

const seen = { updates: [], permissions: [], stops: [] };
let onUpdate = () => {};
const policy = process.env.ACP_POLICY ?? "by-path";

const app = acp
  .client({ name: "keel-acp-test" })
  .onRequest(acp.methods.client.session.requestPermission, async ({ params }) => {
    const input = params.toolCall.rawInput ?? {};
    let option = "allow_once";
    if (policy === "reject-all") option = "reject_always";
    else if (String(input.path ?? "").includes("denied")) option = "reject_once";
    seen.permissions.push({
      title: params.toolCall.title,
      kind: params.toolCall.kind,
      options: params.options.map((o) => o.optionId),
      answer: option,
    });
    return { outcome: { outcome: "selected", optionId: option } };
  })
  .onNotification(acp.methods.client.session.update, async ({ params }) => {
    seen.updates.push(params.update);
    onUpdate(params);
  });

const cwd = process.env.ACP_CWD;
const prompt = (ctx, sessionId, text) =>
  ctx.request(acp.methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text }],
  });

await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
  });
  seen.initialize = init;
  if (scenario === "queue") {
    const { sessionId } = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    seen.sessionId = sessionId;
    const running = new Promise((resolve) => {
      onUpdate = (params) => {
        const u = params.update;
        if (u.sessionUpdate === "tool_call_update" && u.status === "in_progress") resolve();
      };
    });
    const first = prompt(ctx, sessionId, "Run the short command.");
    await running;
    const second = await prompt(ctx, sessionId, "Also say hello.");
    seen.stops.push((await first).stopReason, second.stopReason);
    return;
  }
  if (scenario === "load") {
    seen.list = await ctx.request(acp.methods.agent.session.list, { cwd });
    const sessionId = process.env.ACP_SESSION;
    await ctx.request(acp.methods.agent.session.load, { sessionId, cwd, mcpServers: [] });
    seen.sessionId = sessionId;
    return;
  }
  const mcpServers = JSON.parse(process.env.ACP_MCP ?? "[]");
  const { sessionId } = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers });
  seen.sessionId = sessionId;
  const first = await prompt(ctx, sessionId, "Write approved.txt and denied.txt.");
  seen.stops.push(first.stopReason);
  seen.turnOneUpdates = seen.updates.length;
  if (scenario === "one") return;

  // Cancel once the command runs; a prompt sent meanwhile is queued into the running turn
  // (steering) and, since the turn is cancelled before its next step, answered unjoined.
  const running = new Promise((resolve) => {
    onUpdate = (params) => {
      const u = params.update;
      if (u.sessionUpdate === "tool_call_update" && u.status === "in_progress") resolve();
    };
  });
  const second = prompt(ctx, sessionId, "Run the long command.");
  await running;
  const queued = prompt(ctx, sessionId, "A prompt while a turn runs.").then(
    (answer) => ({ stopReason: answer.stopReason }),
    (error) => ({ code: error.code, data: error.data ?? null }),
  );
  await new Promise((resolve) => setTimeout(resolve, 300));
  const cancelledAt = Date.now();
  await ctx.notify(acp.methods.agent.session.cancel, { sessionId });
  const stopped = await second;
  seen.cancelMs = Date.now() - cancelledAt;
  seen.stops.push(stopped.stopReason);
  seen.busy = await queued;
});

agent.stdin.end();
seen.exitCode = await exited;
process.stdout.write(JSON.stringify(seen) + "\n");

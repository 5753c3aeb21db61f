// The official TypeScript SDK 2.x (@modelcontextprotocol/client, protocol 2026-07-28) with
// @modelcontextprotocol/ext-tasks (the tasks extension) driving `fleetforge mcp` over stdio: job tools
// through the package's task session (it validates every task message against the extension's schema:
// `ttlMs`, `pollIntervalMs`, `resultType`), questions answered through its input handler, and a plain
// `watch` call whose question comes back `input_required` (multi round-trip) and is answered by the
// Client's own auto-fulfilment. Prints a JSON transcript (stdout); tests/e2e/test_mcp_conformance.py
// judges it.
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";
import { failure, print, scenario, sha256, step, tap, until } from "./wire.mjs";

const PROTOCOL = "2026-07-28";
const s = scenario();
const clientInfo = { name: "conformance-sdk2-tasks", version: "2.4.0" };
const capabilities = { elicitation: { form: {} } };
const transport = new StdioClientTransport({ command: s.command, args: s.args, env: s.env, stderr: "inherit" });
const { wire, rawDispatch } = tap(transport);
const client = new Client(clientInfo, { capabilities, versionNegotiation: { mode: { pin: PROTOCOL } } });
const elicited = { task: [], mrtr: [] };
client.setRequestHandler("elicitation/create", async (request) => {  // the multi round-trip path
  elicited.mrtr.push(request.params);
  return { action: "accept", content: s.answers };
});
const steps = {};
const errors = [];

await client.connect(transport);
const session = createTaskSessionFromClient(client, {
  endpointId: "fleetforge-conformance",
  rawDispatch,
  v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo, clientCapabilities: capabilities },
  onError: (e) => errors.push(failure(e)),
  onInputRequest: async (request, context) => {  // the task path: input_required, answered by tasks/update
    elicited.task.push({ kind: request.kind, params: request.params, inputId: context.inputId });
    return context.applicationContext?.decline ? { action: "decline" } : { action: "accept", content: s.answers };
  },
});
const json = (result) => result.structuredContent ?? JSON.parse(result.content[0].text);

/** A job tool through the task session, to its outcome; every task state it went through. */
async function settle(name, args, applicationContext) {
  const execution = await session.callTool(name, args, { applicationContext });
  const seen = [];
  const { outcome } = await execution.settle({
    onEvent: (event) => { if (event.type === "task") seen.push({ status: event.task.status, message: event.task.statusMessage }); } });
  return { kind: execution.kind, task_id: execution.handle?.taskId, seen, outcome: shown(outcome) };
}

function shown(outcome) {
  if (outcome.status === "failed") return { status: "failed", error: failure(outcome.error) };
  return outcome;
}

await step(steps, "list", async () => ({
  tools: (await client.listTools()).tools.map((t) => t.name), server: client.getServerVersion(),
  protocol: client.getNegotiatedProtocolVersion(), capabilities: client.getServerCapabilities() }));

await step(steps, "complete", async () => {
  const done = await settle("inspect", { model: s.model });
  const shownJob = json(await client.callTool({ name: "show", arguments: { job_id: done.task_id } }));
  return { ...done, job_id: done.task_id, status: shownJob.status, artifacts: shownJob.artifacts };
});

await step(steps, "artifact", async () => {
  const [artifact] = steps.complete.artifacts;
  const read = await client.readResource({ uri: artifact.uri });
  return { artifact, read_sha256: sha256(read.contents[0].blob), read_size: Buffer.from(read.contents[0].blob, "base64").length };
});

await step(steps, "elicit", async () => {
  const done = await settle("convert", { model: s.model });
  const result = done.outcome.result?.structuredContent;
  return { ...done, job_id: done.task_id, asked: elicited.task.map((r) => r.params), status: result?.status, result };
});

await step(steps, "elicit_mrtr", async () => {
  const started = json(await client.callTool({ name: "convert", arguments: { model: s.model } }));  // no task: a job id
  const calls = [];
  for (;;) {
    const progress = [];
    const result = await client.callTool({ name: "watch", arguments: { job_id: started.job_id } }, {
      onprogress: (p) => progress.push(p.message), resetTimeoutOnProgress: true });
    calls.push({ result: json(result), isError: result.isError ?? false, progress });
    if (result.isError || ["COMPLETED", "FAILED", "CANCELLED"].includes(json(result).status)) break;
  }
  const shownJob = json(await client.callTool({ name: "show", arguments: { job_id: started.job_id } }));
  return { job_id: started.job_id, asked: elicited.mrtr, status: shownJob.status, result: shownJob.result, watched: calls };
});

await step(steps, "cancel", async () => {
  const execution = await session.callTool("convert", { model: s.model }, { applicationContext: { decline: true } });
  await execution.cancel();
  const { outcome } = await execution.settle();
  const controller = session.task(execution.handle.taskId);  // the server's view, through the package's schema
  const task = await until("the task to be cancelled", async () => {
    const view = await controller.snapshot();
    return view.status === "cancelled" ? view : undefined;
  });
  const shownJob = json(await client.callTool({ name: "show", arguments: { job_id: execution.handle.taskId } }));
  return { job_id: execution.handle.taskId, outcome: shown(outcome), task, status: shownJob.status };
});

await step(steps, "bad_input", async () => {
  const outcome = async (fn) => { try { return { result: await fn() }; } catch (e) { return { error: failure(e) }; } };
  const settled = async (name, args) => {
    const execution = await session.callTool(name, args);
    return { kind: execution.kind, outcome: shown((await execution.settle()).outcome) };
  };
  return {
    missing_model: await outcome(() => settled("convert", { model: s.missing_model })),
    out_of_bounds: await outcome(() => settled("convert", { model: s.model, min_cosine: 2 })),
    unknown_tool: await outcome(() => client.callTool({ name: "no_such_tool", arguments: {} })),
    unknown_task: await outcome(() => rawDispatch({ method: "tasks/get", params: { taskId: "convert/20000101-000000-dead",
      _meta: { "io.modelcontextprotocol/protocolVersion": PROTOCOL, "io.modelcontextprotocol/clientInfo": clientInfo,
               "io.modelcontextprotocol/clientCapabilities": { ...capabilities, extensions: { "io.modelcontextprotocol/tasks": {} } } } } })),
    missing_artifact: await outcome(() => client.readResource({ uri: s.missing_artifact })),
    still_serving: (await client.listTools()).tools.length,
  };
});

await session.close();
await client.close();
print({ client: "@modelcontextprotocol/client@2.4.0 + @modelcontextprotocol/ext-tasks@0.2.2", steps, errors, wire });

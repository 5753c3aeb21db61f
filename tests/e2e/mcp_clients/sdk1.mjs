// The official TypeScript SDK 1.x (@modelcontextprotocol/sdk, protocol 2025-11-25: job ids, no tasks)
// driving `fleetforge mcp` over stdio as an agent host would: the SDK's Client and StdioClientTransport as
// they are, its default request timeout, a form-elicitation handler. Prints a JSON transcript (stdout);
// tests/e2e/test_mcp_conformance.py judges it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { failure, print, scenario, sha256, step, tap, until } from "./wire.mjs";

const s = scenario();
const transport = new StdioClientTransport({ command: s.command, args: s.args, env: s.env, stderr: "inherit" });
const { wire } = tap(transport);
const client = new Client({ name: "conformance-sdk1", version: "1.32.2" }, { capabilities: { elicitation: { form: {} } } });
const elicited = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  elicited.push(request.params);
  return { action: "accept", content: s.answers };
});
const steps = {};
const json = (result) => result.structuredContent ?? JSON.parse(result.content[0].text);

/** `watch` until the job ends: each call within the SDK's default timeout, which progress resets. */
async function follow(jobId) {
  const calls = [];
  for (;;) {
    const progress = [];
    const result = await client.callTool({ name: "watch", arguments: { job_id: jobId } }, undefined, {
      onprogress: (p) => progress.push(p.message), resetTimeoutOnProgress: true });
    calls.push({ result: json(result), isError: result.isError ?? false, progress });
    if (result.isError || ["COMPLETED", "FAILED", "CANCELLED"].includes(json(result).status)) return calls;
  }
}

await client.connect(transport);
await step(steps, "list", async () => ({
  tools: (await client.listTools()).tools.map((t) => t.name), server: client.getServerVersion(),
  protocol: wire.find((m) => m.message.result?.protocolVersion)?.message.result.protocolVersion }));

await step(steps, "complete", async () => {
  const started = json(await client.callTool({ name: "inspect", arguments: { model: s.model } }));
  const watched = await follow(started.job_id);
  const shown = json(await client.callTool({ name: "show", arguments: { job_id: started.job_id } }));
  return { job_id: started.job_id, status: shown.status, artifacts: shown.artifacts, watched };
});

await step(steps, "artifact", async () => {
  const [artifact] = steps.complete.artifacts;
  const read = await client.readResource({ uri: artifact.uri });
  return { artifact, read_sha256: sha256(read.contents[0].blob), read_size: Buffer.from(read.contents[0].blob, "base64").length };
});

await step(steps, "elicit", async () => {
  const started = json(await client.callTool({ name: "convert", arguments: { model: s.model } }));
  const watched = await follow(started.job_id);
  const shown = json(await client.callTool({ name: "show", arguments: { job_id: started.job_id } }));
  return { job_id: started.job_id, asked: elicited, status: shown.status, result: shown.result, watched };
});

await step(steps, "cancel", async () => {
  const started = json(await client.callTool({ name: "convert", arguments: { model: s.model } }));
  const cancelled = json(await client.callTool({ name: "cancel", arguments: { job_id: started.job_id } }));
  const shown = await until("the job to be cancelled", async () => {
    const view = json(await client.callTool({ name: "show", arguments: { job_id: started.job_id } }));
    return view.status === "CANCELLED" ? view : undefined;
  });
  return { job_id: started.job_id, cancelled, status: shown.status };
});

await step(steps, "bad_input", async () => {
  const outcome = async (fn) => { try { return { result: await fn() }; } catch (e) { return { error: failure(e) }; } };
  return {
    missing_model: await outcome(() => client.callTool({ name: "convert", arguments: { model: s.missing_model } })),
    out_of_bounds: await outcome(() => client.callTool({ name: "convert", arguments: { model: s.model, min_cosine: 2 } })),
    unknown_tool: await outcome(() => client.callTool({ name: "no_such_tool", arguments: {} })),
    missing_artifact: await outcome(() => client.readResource({ uri: s.missing_artifact })),
    still_serving: (await client.listTools()).tools.length,
  };
});

await client.close();
print({ client: "@modelcontextprotocol/sdk@1.32.2", steps, wire });

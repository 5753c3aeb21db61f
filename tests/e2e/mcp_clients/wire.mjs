// What the conformance clients share, none of it MCP logic (that is the SDKs' own): the scenario a test
// hands over, the transcript printed on stdout (every JSON-RPC message each way, in order, and what each
// step observed), and a raw request path for @modelcontextprotocol/ext-tasks: its V2 task traffic carries
// shapes the 2.x Client's codecs refuse by design, so the host owns those request ids and their responses
// ("rawDispatch", the package's documented integration point).
import { readFileSync } from "node:fs";
import { createHash } from "node:crypto";

export function scenario() {
  return JSON.parse(readFileSync(process.argv[2], "utf8"));
}

export function sha256(base64) {
  return createHash("sha256").update(Buffer.from(base64, "base64")).digest("hex");
}

/** Records every message the transport carries, and serves `rawDispatch` on it. */
export function tap(transport) {
  const wire = [];
  const raw = new Map();
  let nextRaw = 0;
  let deliver;
  const send = transport.send.bind(transport);
  transport.send = async (message, options) => {
    wire.push({ dir: "->", at: Date.now(), message });
    return send(message, options);
  };
  // The SDK chains onto whatever handler it finds (Protocol.connect wraps the previous onmessage), so the
  // getter hands out a function bound to the handler of that moment, and each message is recorded once.
  let last;
  Object.defineProperty(transport, "onmessage", {
    configurable: true,
    get: () => {
      const handler = deliver;
      return handler && ((message, extra) => {
        if (message !== last) {
          last = message;
          wire.push({ dir: "<-", at: Date.now(), message });
          const pending = message.id !== undefined && raw.get(message.id);
          if (pending && (message.result !== undefined || message.error !== undefined)) {
            raw.delete(message.id);
            pending(message.error !== undefined ? { kind: "error", error: message.error } : { kind: "result", result: message.result });
            return;
          }
        }
        handler(message, extra);
      });
    },
    set: (fn) => { deliver = fn; },
  });
  async function rawDispatch(request, options = {}) {
    const id = `raw-${++nextRaw}`;
    const answered = new Promise((resolve, reject) => {
      raw.set(id, resolve);
      options.signal?.addEventListener("abort", () => { raw.delete(id); reject(options.signal.reason); }, { once: true });
    });
    await transport.send({ jsonrpc: "2.0", id, ...request });
    return answered;
  }
  return { wire, rawDispatch };
}

/** Runs one step: what it returns, or the error it threw (name, message, JSON-RPC code and data). */
export async function step(steps, name, fn) {
  const started = Date.now();
  try {
    steps[name] = { ok: true, ...(await fn()), seconds: (Date.now() - started) / 1000 };
  } catch (e) {
    steps[name] = { ok: false, error: failure(e), seconds: (Date.now() - started) / 1000 };
  }
}

export function failure(e) {
  return { name: e?.constructor?.name ?? typeof e, message: String(e?.message ?? e), code: e?.code, data: e?.data };
}

export async function until(what, fn, { timeoutMs = 240_000, everyMs = 500 } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await fn();
    if (got !== undefined) return got;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export function print(transcript) {
  process.stdout.write(JSON.stringify(transcript) + "\n");
}

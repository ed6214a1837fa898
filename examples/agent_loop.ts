// An agent loop driven through the DeltaBox TypeScript SDK (sdk/typescript, @deltabox/sdk).
//
//   bash hack/npm.sh sdk/typescript && npm install ./sdk/typescript   # in your project
//   npx tsc && DELTABOX_ADDRESS=/run/deltabox/deltabox.sock node agent_loop.js --pool py
//
// The TypeScript twin of examples/agent_loop.py. A scripted "model" plans tool calls; each tool
// call is a step with a save game: checkpoint, run the command in the sandbox, record it in the
// agent's state, and on a failure roll back (files, state and held outbound requests) and try
// again with backoff; on success commit. The second tool fails on its first attempt and leaves
// a mess behind, which the rollback removes. integration/sdk_typescript_test.go runs it.
import { parseArgs } from "node:util";
import { type Attempt, Client, DeltaBoxError, type Sandbox } from "@deltabox/sdk";

// The "model": what it would ask for, one tool call per turn.
const PLAN: Array<[name: string, script: string]> = [
  ["write the notes", "mkdir -p /work && echo 'task: count to 3' > /work/notes.txt"],
  ["count", `echo "attempt $ATTEMPT" >> /work/notes.txt
             echo half > /work/out.partial
             [ "$ATTEMPT" -ge 2 ] || { echo 'flaky tool' >&2; exit 3; }
             seq 1 3 > /work/out.partial && mv /work/out.partial /work/out.txt`],
  ["check", "cat /work/out.txt"],
];

class ToolFailed extends Error {}

interface Turn { tool: string; attempt: number; exit: number; output: string }

async function toolCall(sb: Sandbox, name: string, script: string, attempt: number): Promise<string> {
  const res = await sb.exec(["sh", "-c", script], {
    env: [`ATTEMPT=${attempt}`],
    onStderr: (b) => process.stdout.write(`    stderr: ${b.toString()}`),
  });
  const turn: Turn = { tool: name, attempt, exit: res.code, output: res.text };
  await sb.patchState({ op: "append", path: "/conversation", value: turn });
  if (!res.ok) throw new ToolFailed(`${name}: exit ${res.code}`);
  return res.text;
}

async function main(): Promise<void> {
  const { values: args } = parseArgs({ options: { pool: { type: "string", default: "py" }, address: { type: "string" } } });
  const client = new Client({ address: args.address });
  let id = "";
  await client.withLease(args.pool!, async (sb) => {
    id = sb.id;
    console.log(`leased ${sb.id}`);
    await sb.patchState({ op: "add", path: "/conversation", value: [] });
    const first = await sb.checkpoint({ message: "start" });
    for (const [name, script] of PLAN) {
      const attempts: Attempt[] = [];
      const out = await sb.step((n) => toolCall(sb, name, script, n), {
        message: name, retries: 2, backoffMs: 100, retryOn: (e) => e instanceof ToolFailed, onAttempt: (a) => attempts.push(a),
      });
      for (const a of attempts) {
        if (a.rollback) {
          const rb = a.rollback;
          console.log(`  ${name}: attempt ${a.number} failed (${(a.error as Error).message}); rolled back ${rb.files_restored} files, ` +
            `${rb.ops_undone} state ops, ${rb.effects_dropped} effects in ${rb.total_ms.toFixed(1)} ms`);
        }
      }
      const done = attempts[attempts.length - 1]!;
      console.log(`  ${name}: ok after ${done.number} attempt(s), committed at ${done.commit?.checkpoint}` +
        (out.trim() ? `: ${JSON.stringify(out.trim())}` : ""));
    }
    const diff = await sb.diff({ from: first.checkpoint });
    console.log("files since the start:", (diff.files ?? []).map((f) => `${f.change} ${f.path}`).join(", "));
    const conversation: Turn[] = await sb.state("/conversation");
    console.log("conversation:", JSON.stringify(conversation.map((t) => [t.tool, t.attempt, t.exit])));
  }, { env: ["AGENT=agent_loop.ts"] });
  console.log(`released ${id}`);
  client.close();
}

main().catch((e) => {
  console.error(`agent_loop: ${e instanceof DeltaBoxError ? e.message : e}`);
  process.exit(1);
});

// A LangGraph graph whose tool node runs commands in a DeltaBox sandbox, with DeltaBoxSaver as
// its checkpointer: run it, time-travel to an earlier step, take another branch from there,
// and see that the sandbox's files went back too (docs/langgraph.md).
//
//   DELTABOX_ADDRESS=/run/deltabox/deltabox.sock node examples/time_travel.mjs --pool py
//
// The "agent" here is a fixed plan (no model): each step it picks the next command, and the
// "tools" node runs it in the sandbox. integration/sdk_langgraph_test.go runs this file.
import { parseArgs } from "node:util";
import { Annotation, END, START, StateGraph } from "@langchain/langgraph";
import { Client } from "@deltabox/sdk";
import { DeltaBoxSaver } from "@deltabox/langgraph";

const { values: args } = parseArgs({ options: { pool: { type: "string", default: "py" } } });

const State = Annotation.Root({
  plan: Annotation({ reducer: (_, b) => b, default: () => [] }),
  step: Annotation({ reducer: (_, b) => b, default: () => 0 }),
  command: Annotation({ reducer: (_, b) => b, default: () => "" }),
  log: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
});

function buildGraph(sandbox, saver) {
  const agent = (s) => ({ command: s.step < s.plan.length ? s.plan[s.step] : "" });
  const tools = async (s) => {
    const res = await sandbox.exec(s.command);
    return { step: s.step + 1, log: [`$ ${s.command} -> exit ${res.code} ${res.text.trim()}`.trim()] };
  };
  return new StateGraph(State)
    .addNode("agent", agent)
    .addNode("tools", tools)
    .addEdge(START, "agent")
    .addConditionalEdges("agent", (s) => (s.command ? "tools" : END))
    .addEdge("tools", "agent")
    .compile({ checkpointer: saver });
}

const ls = async (sb) => (await sb.exec("ls /work")).text.split(/\s+/).filter(Boolean).join(" ");

const client = new Client();
const sandbox = await client.lease(args.pool);
try {
  const saver = new DeltaBoxSaver(sandbox, { pin: (md) => md.source === "input" }); // retention keeps run starts
  const graph = buildGraph(sandbox, saver);
  // durability "sync": each step's checkpoint is stored (and the sandbox checkpointed) before
  // the next step starts, so the sandbox checkpoint holds exactly that step's files.
  const thread = { configurable: { thread_id: "demo" }, durability: "sync" };

  const plan = ["mkdir -p /work && echo one > /work/a.txt", "echo two > /work/b.txt", "rm /work/a.txt && echo three > /work/c.txt"];
  const first = await graph.invoke({ plan }, thread);
  console.log("run 1:", first.log.join(" | "));
  console.log("files after run 1:", await ls(sandbox));

  // Time travel: the checkpoint taken after the first tool call (step 1, about to pick step 2).
  const history = [];
  for await (const snap of graph.getStateHistory(thread)) history.push(snap);
  const back = history.find((s) => s.values.step === 1 && s.next.includes("agent"));
  if (!back) throw new Error("no checkpoint after the first tool call in the history");
  console.log(`time travel to checkpoint ${back.config.configurable.checkpoint_id} (step ${back.values.step})`);

  // Another branch from there: a different plan for the steps after the first. updateState
  // reads the checkpoint by its id, which rolls the sandbox back to it.
  const fork = await graph.updateState(back.config, { plan: [plan[0], "echo alt > /work/alt.txt"] });
  console.log("files at the fork:", await ls(sandbox));
  const second = await graph.invoke(null, { ...fork, durability: "sync" });
  console.log("run 2:", second.log.join(" | "));
  console.log("files after run 2:", await ls(sandbox));

  // The first run's branch is still in the tree: going to its last checkpoint brings its files back.
  await saver.moveTo(history[0].config);
  console.log("files back at the end of run 1:", await ls(sandbox));

  const pinned = (await sandbox.checkpoints()).filter((c) => c.pinned).length;
  console.log(`pinned sandbox checkpoints (run starts): ${pinned}`);

  let count = 0;
  for await (const _ of graph.getStateHistory(thread)) count++;
  console.log(`history: ${history.length} checkpoints after run 1, ${count} after run 2 (both branches kept)`);
} finally {
  await sandbox.release();
  client.close();
}

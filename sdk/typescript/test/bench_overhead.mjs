// Times `state patch` and `exec true` through the TypeScript SDK (for the benchmark
// integration/bench_sdk_test.go, which times the same calls through the Go client).
//
//   node bench_overhead.mjs SANDBOX_ID ROUNDS   ->  one JSON line of per-call microseconds
import { Client } from "../dist/index.js";

const [sandbox, rounds] = [process.argv[2], Number(process.argv[3])];
const c = new Client();
const sb = await c.sandbox(sandbox);
const patch = [];
const exe = [];
for (let i = 0; i < rounds; i++) {
  let t = process.hrtime.bigint();
  await sb.patchState([{ op: "add", path: "/n", value: i }]);
  patch.push(Number(process.hrtime.bigint() - t) / 1e3);
  t = process.hrtime.bigint();
  if ((await sb.exec(["true"])).code !== 0) throw new Error("exec true failed");
  exe.push(Number(process.hrtime.bigint() - t) / 1e3);
}
c.close();
console.log(JSON.stringify({ patch_us: patch, exec_us: exe }));

// Tests of the SDK against a real daemon: every call, error mapping, streaming exec with stdin,
// and step() with rollbacks and one commit. integration/sdk_typescript_test.go runs them with
// DELTABOX_ADDRESS (the daemon's socket), DELTABOX_TEST_POOL (a pool of the python image whose
// egress policy holds writes to 127.0.0.1) and DELTABOX_TEST_UPSTREAM (a plain HTTP upstream on
// the host); without them these tests are skipped (and the Go test fails on a skip).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { randomBytes } from "node:crypto";
import {
  Client, ConflictError, ExecError, FailedPreconditionError, InvalidArgumentError, NotFoundError,
} from "../dist/index.js";

const POOL = process.env.DELTABOX_TEST_POOL;
const UPSTREAM = process.env.DELTABOX_TEST_UPSTREAM;
const skip = !(process.env.DELTABOX_ADDRESS && POOL && UPSTREAM) && "needs a daemon (integration/sdk_typescript_test.go)";
const NO_PROXY = ["NO_PROXY=", "no_proxy="]; // the upstream is on the host's loopback: through the proxy
const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), "dbx-"));
const c = new Client();
test.after(() => c.close());

test("info and pools", { skip }, async () => {
  const info = await c.info();
  assert.ok(info.daemon.version);
  assert.ok((await c.pools()).some((p) => p.name === POOL));
  assert.equal((await c.pool(POOL)).name, POOL);
  await assert.rejects(c.pool("no-such-pool"), (e) => e instanceof NotFoundError && e.code === "not_found" && e.status === 404);
  await assert.rejects(c.createPool("Bad Name!", "x"), InvalidArgumentError);
  const image = (await c.pool(POOL)).image;
  const name = "ts-" + randomBytes(3).toString("hex");
  const p = await c.createPool(name, image, { max: 2, labels: { by: "sdk" } });
  assert.deepEqual([p.name, p.max, p.labels], [name, 2, { by: "sdk" }]);
  await assert.rejects(c.createPool(name, image), ConflictError);
  assert.equal((await c.scalePool(name, 0)).min_ready, 0);
  await c.removePool(name, { force: true });
  await assert.rejects(c.pool(name), NotFoundError);
});

test("withLease releases", { skip }, async () => {
  let id;
  await c.withLease(POOL, async (sb) => {
    id = sb.id;
    assert.equal(sb.info.pool, POOL);
    assert.ok((await c.sandboxes()).some((s) => s.sandbox === sb.id));
    assert.deepEqual((await c.sandbox(sb.id)).info.labels, { job: "sdk" });
    assert.equal((await sb.exec("echo $A")).text, "1\n");
  }, { env: ["A=1"], labels: { job: "sdk" } });
  await assert.rejects(c.sandbox(id), NotFoundError);
  await assert.rejects(c.withLease(POOL, () => { throw new Error("boom"); }), /boom/);
});

test("exec streams output and stdin", { skip }, async () => {
  await c.withLease(POOL, async (sb) => {
    const res = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert.deepEqual([res.code, res.stdout.toString(), res.stderr.toString(), res.ok], [3, "out\n", "err\n", false]);
    await assert.rejects(sb.exec("exit 4", { check: true }), (e) => e instanceof ExecError && e.result.code === 4);
    // Full duplex: the second line of input is only sent once the answer to the first came
    // back, so this passes only if output streams while stdin is still open.
    let gotFirst;
    const first = new Promise((r) => (gotFirst = r));
    let seen = "";
    async function* stdin() {
      yield "one\n";
      const timedOut = await Promise.race([first.then(() => false), new Promise((r) => setTimeout(() => r(true), 20000))]);
      if (timedOut) yield "TIMEOUT\n";
      yield Buffer.from("two\n");
    }
    const duplex = await sb.exec(["sh", "-c", 'while read l; do echo "got $l"; done'], {
      stdin: stdin(),
      onStdout: (d) => {
        seen += d.toString();
        if (seen.includes("got one")) gotFirst();
      },
    });
    assert.deepEqual([duplex.code, duplex.text], [0, "got one\ngot two\n"]);
    assert.equal((await sb.exec(["wc", "-c"], { stdin: Buffer.alloc(300000, "x") })).text.trim(), "300000");
    const kinds = [];
    for await (const ev of sb.execStream(["echo", "hi"])) kinds.push(ev.kind);
    assert.deepEqual(kinds, ["stdout", "exit"]);
    assert.equal((await sb.exec(["sleep", "10"], { timeoutMs: 300 })).exit.timed_out, true);
    assert.equal((await sb.exec(["pwd"], { workdir: "/tmp" })).text, "/tmp\n");
    await assert.rejects(sb.exec([]), InvalidArgumentError);
    await assert.rejects(sb.exec(["true"], { env: ["NOEQUALS"] }), InvalidArgumentError);
    const outs = await Promise.all([0, 1, 2, 3].map((i) => sb.exec(["echo", String(i)])));
    assert.deepEqual(outs.map((o) => o.text), ["0\n", "1\n", "2\n", "3\n"]);
  });
});

test("files in and out", { skip }, async () => {
  await c.withLease(POOL, async (sb) => {
    await sb.exec("mkdir -p /work", { check: true });
    await sb.putFile("/work/a.txt", "hello\n");
    assert.equal((await sb.getFile("/work/a.txt")).toString(), "hello\n");
    const src = tmp();
    fs.mkdirSync(path.join(src, "tree", "sub"), { recursive: true });
    fs.writeFileSync(path.join(src, "tree", "sub", "b.txt"), "bee");
    fs.symlinkSync("sub/b.txt", path.join(src, "tree", "link"));
    const res = await sb.put(path.join(src, "tree"), "/work");
    assert.ok(res.entries >= 3, JSON.stringify(res));
    assert.equal((await sb.exec("cat /work/tree/sub/b.txt /work/tree/link")).text, "beebee");
    const out = tmp();
    const names = await sb.get("/work/tree", out);
    assert.ok(names.includes("tree/sub/b.txt"), names.join(","));
    assert.equal(fs.readFileSync(path.join(out, "tree", "sub", "b.txt"), "utf8"), "bee");
    assert.equal(fs.readlinkSync(path.join(out, "tree", "link")), "sub/b.txt");
    const raw = await sb.copyFrom("/work/a.txt");
    assert.ok(raw.length > 512);
    await sb.copyTo("/work/copy.txt", raw);
    assert.equal((await sb.exec("cat /work/copy.txt")).text, "hello\n");
    await assert.rejects(sb.getFile("/work/missing"), NotFoundError);
    // An entry the sandbox made to point out of the tree is refused on the way out.
    await sb.exec("mkdir -p /work/evil && ln -s /etc /work/evil/etc", { check: true });
    const dest = tmp();
    await assert.rejects(sb.get("/work/evil", dest), InvalidArgumentError);
    assert.deepEqual(fs.readdirSync(dest), []);
  });
});

test("checkpoints, state, rollback, commit, diff", { skip }, async () => {
  await c.withLease(POOL, async (sb) => {
    let r = await sb.patchState([{ op: "add", path: "/plan", value: ["a"] }]);
    const seq = r.seq;
    assert.equal(r.applied, 1);
    const ck = await sb.checkpoint({ message: "planned", name: "planned", pin: true });
    assert.deepEqual([ck.message, ck.name], ["planned", "planned"]);
    await sb.exec("echo x > /tmp/x", { check: true });
    r = await sb.patchState({ op: "append", path: "/plan", value: "b" }, { ifSeq: seq });
    await assert.rejects(sb.patchState({ op: "append", path: "/plan", value: "c" }, { ifSeq: seq }),
      (e) => e instanceof ConflictError && e.status === 409);
    await assert.rejects(sb.patchState([{ op: "frobnicate", path: "/plan" }]), InvalidArgumentError);
    await assert.rejects(sb.patchState([{ op: "test", path: "/plan/0", value: "zzz" }]), FailedPreconditionError);
    assert.deepEqual(await sb.state(), { plan: ["a", "b"] });
    assert.equal(await sb.state("/plan/1"), "b");
    assert.ok((await sb.stateLog()).some((e) => e.op.op === "append"));
    const d = await sb.diff({ from: ck.checkpoint });
    assert.ok(d.files.some((f) => f.path === "/tmp/x"));
    assert.equal(d.state.length, 1);
    assert.ok((await sb.checkpoints()).some((x) => x.checkpoint === ck.checkpoint));
    assert.equal((await sb.checkpointInfo(ck.checkpoint)).checkpoint, ck.checkpoint);
    await assert.rejects(sb.checkpointInfo("no-such-checkpoint"), NotFoundError);
    const rb = await sb.rollback({ to: ck.checkpoint });
    assert.deepEqual([rb.to, rb.ops_undone], [ck.checkpoint, 1]);
    assert.deepEqual(await sb.state(), { plan: ["a"] });
    assert.notEqual((await sb.exec("test -e /tmp/x")).code, 0);
    const latest = await sb.checkpoint();
    const v = await sb.verify();
    assert.deepEqual([v.ok, v.checkpoint], [true, latest.checkpoint]);
    assert.equal((await sb.commit()).effects_released, 0);
    await assert.rejects(sb.rollback({ to: ck.checkpoint }), FailedPreconditionError); // past the commit point
    assert.ok((await sb.refresh()).sandbox === sb.id);
  });
});

test("step fails twice then succeeds", { skip }, async () => {
  await c.withLease(POOL, async (sb) => {
    await sb.exec("mkdir -p /work", { check: true });
    await sb.patchState({ op: "add", path: "/attempts", value: [] });
    const attempts = [];
    const result = await sb.step(async (n) => {
      await sb.exec(`echo ${n} > /work/attempt-${n}`, { check: true });
      await sb.patchState({ op: "append", path: "/attempts", value: n });
      const post = await sb.exec(["curl", "-sS", "-m", "10", "-X", "POST", "-d", `n=${n}`, UPSTREAM + "/step"]);
      assert.equal(post.code, 0, post.stderr.toString());
      if (n < 3) throw new Error(`attempt ${n} fails`);
      return "done";
    }, { message: "post the result", retries: 2, backoffMs: 10, onAttempt: (a) => attempts.push(a) });
    assert.equal(result, "done");
    assert.deepEqual(attempts.map((a) => a.number), [1, 2, 3]);
    assert.deepEqual(attempts.slice(0, 2).map((a) => a.rollback.effects_dropped), [1, 1]);
    assert.equal(attempts[2].commit.effects_released, 1);
    assert.equal(attempts[0].checkpoint.message, "post the result (attempt 1)");
    assert.deepEqual(await sb.state("/attempts"), [3]);
    assert.deepEqual((await sb.exec("ls /work")).text.split(/\s+/).filter(Boolean), ["attempt-3"]);
    assert.deepEqual((await sb.effects()).map((e) => e.status).sort(), ["dropped", "dropped", "released"]);
    const released = await sb.effects({ status: "released" });
    assert.equal(released.length, 1);
    assert.equal((await sb.effect(released[0].effect)).url, UPSTREAM + "/step");
    assert.equal((await sb.retryEffects()).effects_released, 0);
    await assert.rejects(sb.abandonEffect("no-such-effect"), NotFoundError);
    // The last attempt failing throws its error, after its rollback.
    await assert.rejects(sb.step(async () => {
      await sb.exec("echo z > /work/z", { check: true });
      throw new RangeError("boom");
    }), RangeError);
    assert.notEqual((await sb.exec("test -e /work/z")).code, 0);
    // retryOn: an error it refuses is not retried.
    let calls = 0;
    await assert.rejects(sb.step(() => { calls++; throw new TypeError("fatal"); },
      { retries: 3, backoffMs: 1, retryOn: (e) => !(e instanceof TypeError) }), TypeError);
    assert.equal(calls, 1);
  }, { env: NO_PROXY });
});

test("snapshot, restore, fork", { skip }, async () => {
  await c.withLease(POOL, async (sb) => {
    await sb.patchState({ op: "add", path: "/k", value: "v" });
    const phases = [];
    const snap = await sb.snapshot({ onProgress: (p) => phases.push(p.phase) });
    assert.ok(phases.length > 0);
    assert.ok((await c.snapshots()).some((s) => s.uri === snap.uri));
    const restored = await c.restore(snap.uri);
    try {
      assert.notEqual(restored.id, sb.id);
      assert.equal(await restored.state("/k"), "v");
    } finally {
      await restored.release();
    }
    const forks = await sb.fork({ count: 1 });
    assert.equal(forks.length, 1);
    try {
      assert.equal(await forks[0].state("/k"), "v");
    } finally {
      await forks[0].release();
    }
    await c.removeSnapshot(snap.uri);
    assert.ok(!(await c.snapshots()).some((s) => s.uri === snap.uri));
    await assert.rejects(c.restore("no-such-snapshot"), NotFoundError);
  });
});

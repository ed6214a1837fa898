"""Tests of the SDK against a real daemon: every call, error mapping, streaming exec with
stdin, and step() with rollbacks and one commit.

integration/sdk_python_test.go runs them with DELTABOX_ADDRESS (the daemon's socket),
DELTABOX_TEST_POOL (a pool of the python image whose egress policy holds writes to
127.0.0.1) and DELTABOX_TEST_UPSTREAM (a plain HTTP upstream on the host); without them
these tests are skipped.
"""
import asyncio
import io
import json
import os
import sys
import tempfile
import threading
import unittest
import uuid

try:
    import deltabox
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import deltabox

ADDRESS = os.environ.get("DELTABOX_ADDRESS")
POOL = os.environ.get("DELTABOX_TEST_POOL")
UPSTREAM = os.environ.get("DELTABOX_TEST_UPSTREAM")
NO_PROXY = ["NO_PROXY=", "no_proxy="]  # the upstream is on the host's loopback: through the proxy


@unittest.skipUnless(ADDRESS and POOL and UPSTREAM, "needs a daemon (integration/sdk_python_test.go)")
class Daemon(unittest.TestCase):
    def setUp(self):
        self.c = deltabox.Client()

    def tearDown(self):
        self.c.close()

    def test_info_and_pools(self):
        info = self.c.info()
        self.assertIn("version", info["daemon"])
        self.assertIn(POOL, [p["name"] for p in self.c.pools()])
        self.assertEqual(self.c.pool(POOL)["name"], POOL)
        with self.assertRaises(deltabox.NotFound) as cm:
            self.c.pool("no-such-pool")
        self.assertEqual((cm.exception.code, cm.exception.status), ("not_found", 404))
        with self.assertRaises(deltabox.InvalidArgument):
            self.c.create_pool("Bad Name!", "x")
        image = self.c.pool(POOL)["image"]
        name = "sdk-" + uuid.uuid4().hex[:6]
        p = self.c.create_pool(name, image, min_ready=0, max=2, labels={"by": "sdk"})
        self.assertEqual((p["name"], p["max"], p["labels"]), (name, 2, {"by": "sdk"}))
        with self.assertRaises(deltabox.Conflict):
            self.c.create_pool(name, image)
        self.assertEqual(self.c.scale_pool(name, 0)["min_ready"], 0)
        self.c.remove_pool(name, force=True)
        with self.assertRaises(deltabox.NotFound):
            self.c.pool(name)

    def test_lease_context_manager_releases(self):
        with self.c.lease(POOL, env=["A=1"], labels={"job": "sdk"}) as sb:
            self.assertEqual(sb.info["pool"], POOL)
            self.assertIn(sb.id, [s["sandbox"] for s in self.c.sandboxes()])
            self.assertEqual(self.c.sandbox(sb.id).info["labels"], {"job": "sdk"})
            self.assertEqual(sb.exec("echo $A").text, "1\n")
        with self.assertRaises(deltabox.NotFound):
            self.c.sandbox(sb.id)
        with self.assertRaises(deltabox.NotFound):
            sb.release()

    def test_exec_streams_output_and_stdin(self):
        with self.c.lease(POOL) as sb:
            res = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
            self.assertEqual((res.code, res.stdout, res.stderr), (3, b"out\n", b"err\n"))
            self.assertFalse(res.ok)
            with self.assertRaises(deltabox.ExecError):
                sb.exec("exit 4", check=True)
            # Full duplex: the second line of input is only sent once the answer to the first
            # came back, so this passes only if output streams while stdin is still open.
            got_first = threading.Event()
            seen = []

            def stdin():
                yield b"one\n"
                if not got_first.wait(20):
                    yield b"TIMEOUT\n"
                yield b"two\n"

            def on_out(data):
                seen.append(data)
                if b"got one" in b"".join(seen):
                    got_first.set()

            res = sb.exec(["sh", "-c", 'while read l; do echo "got $l"; done'], stdin=stdin(), on_stdout=on_out)
            self.assertEqual((res.code, res.text), (0, "got one\ngot two\n"))
            res = sb.exec(["wc", "-c"], stdin=io.BytesIO(b"x" * 300000))
            self.assertEqual(res.text.strip(), "300000")
            kinds = [ev.kind for ev in sb.exec_iter(["echo", "hi"])]
            self.assertEqual(kinds, ["stdout", "exit"])
            self.assertEqual(sb.exec(["sleep", "10"], timeout=0.3).exit.get("timed_out"), True)
            with self.assertRaises(deltabox.InvalidArgument):
                sb.exec([])
            with self.assertRaises(deltabox.InvalidArgument):
                sb.exec(["true"], env=["NOEQUALS"])

    def test_files_in_and_out(self):
        with self.c.lease(POOL) as sb:
            sb.exec("mkdir -p /work", check=True)
            sb.put_file("/work/a.txt", "hello\n")
            self.assertEqual(sb.get_file("/work/a.txt"), b"hello\n")
            src = tempfile.mkdtemp()
            os.makedirs(os.path.join(src, "tree", "sub"))
            with open(os.path.join(src, "tree", "sub", "b.txt"), "w") as f:
                f.write("bee")
            res = sb.put(os.path.join(src, "tree"), "/work")
            self.assertGreaterEqual(res["entries"], 3)
            self.assertEqual(sb.exec("cat /work/tree/sub/b.txt").text, "bee")
            out = tempfile.mkdtemp()
            names = sb.get("/work/tree", out)
            self.assertIn("tree/sub/b.txt", names)
            with open(os.path.join(out, "tree", "sub", "b.txt")) as f:
                self.assertEqual(f.read(), "bee")
            raw = sb.copy_from("/work/a.txt")
            self.assertGreater(len(raw), 512)
            sb.copy_to("/work/copy.txt", raw)
            self.assertEqual(sb.exec("cat /work/copy.txt").text, "hello\n")
            with self.assertRaises(deltabox.NotFound):
                sb.get_file("/work/missing")

    def test_checkpoints_state_rollback_commit_diff(self):
        with self.c.lease(POOL) as sb:
            r = sb.patch_state([{"op": "add", "path": "/plan", "value": ["a"]}])
            seq = r["seq"]
            self.assertEqual(r["applied"], 1)
            ck = sb.checkpoint("planned", name="planned", pin=True)
            self.assertEqual((ck["message"], ck["name"]), ("planned", "planned"))
            sb.exec("echo x > /tmp/x", check=True)
            r = sb.patch_state({"op": "append", "path": "/plan", "value": "b"}, if_seq=seq)
            with self.assertRaises(deltabox.Conflict) as cm:
                sb.patch_state({"op": "append", "path": "/plan", "value": "c"}, if_seq=seq)
            self.assertEqual(cm.exception.status, 409)
            with self.assertRaises(deltabox.InvalidArgument):
                sb.patch_state([{"op": "frobnicate", "path": "/plan"}])
            with self.assertRaises(deltabox.FailedPrecondition):
                sb.patch_state([{"op": "test", "path": "/plan/0", "value": "zzz"}])
            self.assertEqual(sb.state(), {"plan": ["a", "b"]})
            self.assertEqual(sb.state("/plan/1"), "b")
            self.assertTrue(any(e["op"]["op"] == "append" for e in sb.state_log()))
            d = sb.diff(ck["checkpoint"])
            self.assertIn("/tmp/x", [f["path"] for f in d["files"]])
            self.assertEqual(len(d["state"]), 1)
            self.assertIn(ck["checkpoint"], [c["checkpoint"] for c in sb.checkpoints()])
            self.assertEqual(sb.checkpoint_info(ck["checkpoint"])["checkpoint"], ck["checkpoint"])
            with self.assertRaises(deltabox.NotFound):
                sb.checkpoint_info("no-such-checkpoint")
            rb = sb.rollback(ck["checkpoint"])
            self.assertEqual((rb["to"], rb["ops_undone"]), (ck["checkpoint"], 1))
            self.assertEqual(sb.state(), {"plan": ["a"]})
            self.assertNotEqual(sb.exec("test -e /tmp/x").code, 0)
            latest = sb.checkpoint()
            v = sb.verify()
            self.assertEqual((v["ok"], v["checkpoint"]), (True, latest["checkpoint"]), v)
            cm2 = sb.commit()
            self.assertEqual(cm2["effects_released"], 0)
            with self.assertRaises(deltabox.FailedPrecondition):
                sb.rollback(ck["checkpoint"])  # past the commit point

    def test_step_fails_twice_then_succeeds(self):
        with self.c.lease(POOL, env=NO_PROXY) as sb:
            sb.exec("mkdir -p /work", check=True)
            sb.patch_state({"op": "add", "path": "/attempts", "value": []})
            step = sb.step("post the result", retries=2, backoff=0.01)
            for attempt in step:
                with attempt:
                    n = attempt.number
                    sb.exec(f"echo {n} > /work/attempt-{n}", check=True)
                    sb.patch_state({"op": "append", "path": "/attempts", "value": n})
                    post = sb.exec(["curl", "-sS", "-m", "10", "-X", "POST", "-d", f"n={n}", UPSTREAM + "/step"])
                    self.assertEqual(post.code, 0, post.stderr)
                    if n < 3:
                        raise RuntimeError(f"attempt {n} fails")
            self.assertEqual([a.number for a in step.attempts], [1, 2, 3])
            self.assertEqual([a.rollback_result["effects_dropped"] for a in step.attempts[:2]], [1, 1])
            self.assertEqual(step.attempts[2].commit_result["effects_released"], 1)
            self.assertEqual(sb.state("/attempts"), [3])
            self.assertEqual(sb.exec("ls /work").text.split(), ["attempt-3"])
            statuses = sorted(e["status"] for e in sb.effects())
            self.assertEqual(statuses, ["dropped", "dropped", "released"])
            released = sb.effects(status="released")
            self.assertEqual(len(released), 1)
            self.assertEqual(sb.effect(released[0]["effect"])["url"], UPSTREAM + "/step")
            self.assertEqual(sb.retry_effects()["effects_released"], 0)
            with self.assertRaises(deltabox.NotFound):
                sb.abandon_effect("no-such-effect")
            # The last attempt failing raises its error, after its rollback.
            with self.assertRaises(ValueError):
                with sb.step():
                    sb.exec("echo z > /work/z", check=True)
                    raise ValueError("boom")
            self.assertNotEqual(sb.exec("test -e /work/z").code, 0)
            self.assertEqual(sb.run_step(lambda n: n * 10, retries=1), 10)

    def test_snapshot_restore_fork(self):
        with self.c.lease(POOL) as sb:
            sb.patch_state({"op": "add", "path": "/k", "value": "v"})
            phases = []
            snap = sb.snapshot(on_progress=lambda p: phases.append(p["phase"]))
            self.assertTrue(phases)
            self.assertIn(snap["uri"], [s["uri"] for s in self.c.snapshots()])
            with self.c.restore(snap["uri"]) as restored:
                self.assertNotEqual(restored.id, sb.id)
                self.assertEqual(restored.state("/k"), "v")
            forks = sb.fork(count=1)
            self.assertEqual(len(forks), 1)
            with forks[0] as f:
                self.assertEqual(f.state("/k"), "v")
            self.c.remove_snapshot(snap["uri"])
            self.assertNotIn(snap["uri"], [s["uri"] for s in self.c.snapshots()])
            with self.assertRaises(deltabox.NotFound):
                self.c.restore("no-such-snapshot")

    def test_inside_a_sandbox(self):
        # Every sandbox has the SDK, read-only at /.deltabox/sdk/python and on PYTHONPATH: the
        # same package drives the sandbox's own API with nothing installed.
        script = """
import json, deltabox
me = deltabox.inside()
me.patch_state({"op": "add", "path": "/from_inside", "value": 1})
ck = me.checkpoint("inside")
out = {"ckpt": ck["checkpoint"], "state": me.state(), "file": deltabox.__file__}
try:
    me.commit()
except deltabox.NotFound as e:
    out["commit"] = e.code
try:
    me.rollback(force=True)
except deltabox.FailedPrecondition as e:
    out["force"] = e.code
print(json.dumps(out))
"""
        with self.c.lease(POOL) as sb:
            res = sb.exec(["python3", "-c", script])
            self.assertEqual(res.code, 0, res.stderr)
            out = json.loads(res.text)
            self.assertEqual(out["state"], {"from_inside": 1})
            self.assertEqual(out["file"], "/.deltabox/sdk/python/deltabox/__init__.py")
            self.assertEqual((out.get("commit"), out.get("force")), ("not_found", "failed_precondition"))
            self.assertEqual(sb.state("/from_inside"), 1)
            self.assertIn(out["ckpt"], [c["checkpoint"] for c in sb.checkpoints()])
            # The shell client, and the SDK's files are the daemon's (read-only, same as the tree's).
            sh = sb.exec("/.deltabox/sdk/bin/deltabox patch '{\"op\": \"add\", \"path\": \"/sh\", \"value\": 2}' >/dev/null"
                         " && /.deltabox/sdk/bin/deltabox state /sh && /.deltabox/sdk/bin/deltabox checkpoint -m from-sh")
            self.assertEqual(sh.code, 0, sh.stderr)
            self.assertTrue(sh.text.startswith("2\n"), sh.text)
            self.assertIn("from-sh", [c.get("message") for c in sb.checkpoints()])
            bad = sb.exec("/.deltabox/sdk/bin/deltabox rollback no-such-checkpoint")
            self.assertEqual(bad.code, 1)
            self.assertIn("not_found", bad.stderr.decode())
            self.assertNotEqual(sb.exec("echo x > /.deltabox/sdk/python/deltabox/client.py").code, 0)
            mine = os.path.join(os.path.dirname(os.path.abspath(deltabox.__file__)), "client.py")
            with open(mine, "rb") as f:
                self.assertEqual(sb.get_file("/.deltabox/sdk/python/deltabox/client.py"), f.read())
            # PYTHONPATH names it (after any PYTHONPATH the pool sets).
            self.assertEqual(sb.exec("echo $PYTHONPATH").text, "/.deltabox/sdk/python\n")

    def test_asyncio(self):
        from deltabox.aio import AsyncClient

        async def main():
            async with AsyncClient() as c:
                async with await c.lease(POOL) as sb:
                    step = sb.step(retries=1, backoff=0.01)
                    async for attempt in step:
                        async with attempt:
                            await sb.exec(f"echo > /tmp/a{attempt.number}", check=True)
                            if attempt.number == 1:
                                raise RuntimeError("the first attempt fails")
                    outs = await asyncio.gather(*[sb.exec(["echo", str(i)]) for i in range(4)])
                    ls = (await sb.exec("ls /tmp")).text.split()
                    return sb.id, [a.number for a in step.attempts], ls, [o.text for o in outs]

        sid, attempts, ls, outs = asyncio.run(main())
        self.assertEqual(attempts, [1, 2])
        self.assertIn("a2", ls)
        self.assertNotIn("a1", ls)
        self.assertEqual(outs, ["0\n", "1\n", "2\n", "3\n"])
        with self.assertRaises(deltabox.NotFound):
            self.c.sandbox(sid)  # released by async with


if __name__ == "__main__":
    unittest.main()

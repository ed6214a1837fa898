// The real e2b SDK (pinned in package.json) against DeltaBox's E2B-compatible API.
// Run by integration/e2b_test.go with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at
// a daemon whose pool DELTABOX_E2B_TEMPLATE is warm; DELTABOX_E2B_OTHER_KEY is a second tenant.
'use strict'
const { test } = require('node:test')
const assert = require('node:assert/strict')
const {
  Sandbox, CommandExitError, AuthenticationError, NotFoundError, FileNotFoundError, SandboxError,
} = require('e2b')

const template = process.env.DELTABOX_E2B_TEMPLATE
const otherKey = process.env.DELTABOX_E2B_OTHER_KEY
const apiUrl = process.env.E2B_API_URL
assert.ok(template && otherKey && apiUrl && process.env.E2B_SANDBOX_URL, 'the Go test sets the environment')

// create makes a sandbox that is killed when the test t ends (the pool is small).
async function create(t, opts, tmpl = template) {
  const sb = await Sandbox.create(tmpl, opts)
  t.after(() => sb.kill().catch(() => {}))
  return sb
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
async function waitFor(what, fn, ms = 5000) {
  const end = Date.now() + ms
  for (;;) {
    if (await fn()) return
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await sleep(25)
  }
}

// deltabox calls one of DeltaBox's own routes on an E2B sandbox.
async function deltabox(sandboxId, route, body, key = process.env.E2B_API_KEY) {
  const res = await fetch(`${apiUrl}/sandboxes/${sandboxId}/deltabox/${route}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { 'X-API-KEY': key, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

test('create, info and list', async (t) => {
  const sb = await create(t, { metadata: { purpose: 'e2b-test' } })
  assert.match(sb.sandboxId, /\S/)
  const info = await sb.getInfo()
  assert.equal(info.sandboxId, sb.sandboxId)
  assert.equal(info.templateId, template)
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { purpose: 'e2b-test' })
  assert.ok(info.endAt > info.startedAt)
  const items = await Sandbox.list({ query: { metadata: { purpose: 'e2b-test' } } }).nextItems()
  assert.ok(items.some((s) => s.sandboxId === sb.sandboxId), 'list shows the sandbox')
  const second = await create(t, { metadata: { purpose: 'e2b-test' } })
  const pages = Sandbox.list({ limit: 1, query: { metadata: { purpose: 'e2b-test' } } })
  const seen = []
  while (pages.hasNext) seen.push(...(await pages.nextItems()).map((s) => s.sandboxId))
  assert.deepEqual(seen.sort(), [sb.sandboxId, second.sandboxId].sort(), 'one sandbox a page, each once')
  assert.equal(await sb.isRunning(), true)
  const [m] = await sb.getMetrics()
  assert.ok(m.memUsed > 0 && m.diskTotal > 0 && m.cpuCount >= 1, JSON.stringify(m))
  assert.ok(m.cpuUsedPct >= 0 && m.diskUsed <= m.diskTotal, JSON.stringify(m))
})

test('commands.run in the foreground: exit code, stdout and stderr', async (t) => {
  const sb = await create(t)
  const ok = await sb.commands.run('echo out; echo err >&2', { envs: { X: 'y' } })
  assert.equal(ok.exitCode, 0)
  assert.equal(ok.stdout, 'out\n')
  assert.equal(ok.stderr, 'err\n')
  const env = await sb.commands.run('echo $X; pwd', { envs: { X: 'from-envs' }, cwd: '/tmp' })
  assert.equal(env.stdout, 'from-envs\n/tmp\n')
  await assert.rejects(sb.commands.run('echo bad >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stderr, 'bad\n')
    return true
  })
})

test('commands in the background: callbacks, list, connect, kill', async (t) => {
  const sb = await create(t)
  const seen = []
  const h = await sb.commands.run('for i in 1 2 3; do echo $i; sleep 0.05; done', {
    background: true, onStdout: (d) => seen.push(d),
  })
  assert.ok(h.pid > 0)
  const res = await h.wait()
  assert.equal(res.exitCode, 0)
  assert.equal(seen.join(''), '1\n2\n3\n')

  const long = await sb.commands.run('sleep 30', { background: true })
  const procs = await sb.commands.list()
  assert.ok(procs.some((p) => p.pid === long.pid), 'list shows the running command')
  const again = await sb.commands.connect(long.pid)
  assert.equal(again.pid, long.pid)
  assert.equal(await sb.commands.kill(long.pid), true)
  await assert.rejects(long.wait(), (err) => err instanceof CommandExitError && err.exitCode !== 0)
  await waitFor('the killed command to leave the list', async () =>
    !(await sb.commands.list()).some((p) => p.pid === long.pid))
  assert.equal(await sb.commands.kill(long.pid), false, 'killing a gone command reports false')
})

test('many commands at once on one sandbox; a large file round trip', async (t) => {
  const sb = await create(t)
  const runs = await Promise.all(Array.from({ length: 16 }, (_, i) => sb.commands.run(`echo ${i}; echo e${i} >&2`)))
  runs.forEach((r, i) => {
    assert.equal(r.stdout, `${i}\n`)
    assert.equal(r.stderr, `e${i}\n`)
  })
  const big = Buffer.alloc(3 << 20)
  for (let i = 0; i < big.length; i++) big[i] = (i * 7919) & 0xff
  await sb.files.write('/tmp/big.bin', new Blob([big]))
  const back = Buffer.from(await sb.files.read('/tmp/big.bin', { format: 'bytes' }))
  assert.ok(back.equals(big), 'the 3 MiB file came back unchanged')
  const sum = await sb.commands.run('wc -c < /tmp/big.bin')
  assert.equal(sum.stdout.trim(), String(big.length))
  const out = await sb.commands.run('head -c 2000000 /dev/zero | tr "\\0" x')
  assert.equal(out.stdout.length, 2000000)
})

test('stdin: send and close', async (t) => {
  const sb = await create(t)
  const h = await sb.commands.run('cat', { background: true, stdin: true })
  await h.sendStdin('hello ')
  await sb.commands.sendStdin(h.pid, 'world\n')
  await h.closeStdin()
  const res = await h.wait()
  assert.equal(res.stdout, 'hello world\n')
})

test('files: write, read, list, stat, rename, make dir, remove', async (t) => {
  const sb = await create(t)
  const info = await sb.files.write('/tmp/e2b/a.txt', 'hello files')
  assert.equal(info.path, '/tmp/e2b/a.txt')
  assert.equal(await sb.files.read('/tmp/e2b/a.txt'), 'hello files')
  const bytes = await sb.files.read('/tmp/e2b/a.txt', { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'hello files')
  await sb.files.write([{ path: '/tmp/e2b/b.txt', data: 'B' }, { path: '/tmp/e2b/sub/c.txt', data: 'C' }])
  assert.equal((await sb.commands.run('cat /tmp/e2b/b.txt /tmp/e2b/sub/c.txt')).stdout, 'BC')
  const names = (await sb.files.list('/tmp/e2b')).map((e) => `${e.name}:${e.type}`).sort()
  assert.deepEqual(names, ['a.txt:file', 'b.txt:file', 'sub:dir'])
  const deep = (await sb.files.list('/tmp/e2b', { depth: 2 })).map((e) => e.path).sort()
  assert.ok(deep.includes('/tmp/e2b/sub/c.txt'))
  const st = await sb.files.getInfo('/tmp/e2b/a.txt')
  assert.equal(st.size, 11)
  assert.equal(st.type, 'file')
  assert.equal(await sb.files.exists('/tmp/e2b/a.txt'), true)
  assert.equal(await sb.files.exists('/tmp/e2b/nope'), false)
  const moved = await sb.files.rename('/tmp/e2b/a.txt', '/tmp/e2b/moved.txt')
  assert.equal(moved.path, '/tmp/e2b/moved.txt')
  assert.equal(await sb.files.makeDir('/tmp/e2b/newdir'), true)
  assert.equal(await sb.files.makeDir('/tmp/e2b/newdir'), false, 'an existing dir reports false')
  await sb.files.remove('/tmp/e2b/sub')
  assert.equal(await sb.files.exists('/tmp/e2b/sub/c.txt'), false)
  await assert.rejects(sb.files.read('/tmp/e2b/a.txt'), FileNotFoundError)
  // Written by a command, read through files: one filesystem.
  await sb.commands.run('echo from-cmd > /tmp/e2b/cmd.txt')
  assert.equal(await sb.files.read('/tmp/e2b/cmd.txt'), 'from-cmd\n')
  // A path through a symlink the sandbox made is refused, never followed on the host.
  await sb.commands.run('ln -s / /tmp/e2b/escape')
  await assert.rejects(sb.files.read('/tmp/e2b/escape/etc/passwd'), SandboxError)
})

test('files: watch a directory', async (t) => {
  const sb = await create(t)
  await sb.files.makeDir('/tmp/watched')
  const events = []
  const w = await sb.files.watchDir('/tmp/watched', (e) => events.push(e))
  await sb.files.write('/tmp/watched/new.txt', 'x')
  await waitFor('a create event', () => events.some((e) => e.name === 'new.txt' && e.type === 'create'))
  await sb.commands.run('rm /tmp/watched/new.txt')
  await waitFor('a remove event', () => events.some((e) => e.name === 'new.txt' && e.type === 'remove'))
  await w.stop()
})

test('kill releases the sandbox', async (t) => {
  const sb = await create(t)
  await sb.kill()
  await assert.rejects(Sandbox.getInfo(sb.sandboxId), NotFoundError)
  assert.equal(await Sandbox.kill(sb.sandboxId), false, 'a second kill finds nothing')
  await assert.rejects(sb.commands.run('true'))
})

test('timeout: a sandbox whose timeout passes is released; setTimeout extends it', async (t) => {
  const short = await create(t, { timeoutMs: 1000 })
  const kept = await create(t, { timeoutMs: 1000 })
  await kept.setTimeout(60_000)
  await sleep(2000)
  await assert.rejects(Sandbox.getInfo(short.sandboxId), NotFoundError)
  assert.equal((await kept.getInfo()).state, 'running')
})

test("timeout with onTimeout: 'pause' pauses; connect resumes", async (t) => {
  const sb = await create(t, { timeoutMs: 1000, lifecycle: { onTimeout: 'pause' } })
  await sb.files.write('/tmp/auto.txt', 'paused by its timeout')
  await waitFor('the timeout to pause the sandbox', async () => (await sb.getInfo()).state === 'paused', 10000)
  const back = await Sandbox.connect(sb.sandboxId, { timeoutMs: 60_000 })
  assert.equal(await back.files.read('/tmp/auto.txt'), 'paused by its timeout')
  assert.equal((await back.getInfo()).state, 'running')
})

test('pause and resume keep the files', async (t) => {
  const sb = await create(t)
  await sb.files.write('/tmp/keep.txt', 'kept across pause')
  assert.equal(await sb.pause(), true)
  assert.equal((await Sandbox.getInfo(sb.sandboxId)).state, 'paused')
  assert.equal(await Sandbox.pause(sb.sandboxId), false, 'pausing a paused sandbox reports false')
  const back = await Sandbox.connect(sb.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/tmp/keep.txt'), 'kept across pause')
  assert.equal((await back.commands.run('cat /tmp/keep.txt')).stdout, 'kept across pause')
})

test('fork: copies with the files of the source (DeltaBox fork: one L3 snapshot, restored twice)', async (t) => {
  const sb = await create(t, {}, process.env.DELTABOX_E2B_FORK_TEMPLATE)
  await sb.files.write('/tmp/forked.txt', 'from the source')
  const forks = await sb.fork({ count: 2 })
  for (const f of forks) if (!(f instanceof Error)) t.after(() => f.kill().catch(() => {}))
  assert.equal(forks.length, 2)
  for (const f of forks) {
    assert.ok(!(f instanceof Error), String(f))
    assert.notEqual(f.sandboxId, sb.sandboxId)
    assert.equal(await f.files.read('/tmp/forked.txt'), 'from the source')
    assert.equal((await f.commands.run('cat /tmp/forked.txt')).stdout, 'from the source')
  }
  await forks[0].files.write('/tmp/forked.txt', 'changed in fork 0')
  assert.equal(await forks[1].files.read('/tmp/forked.txt'), 'from the source')
  assert.equal(await sb.files.read('/tmp/forked.txt'), 'from the source')
  await assert.rejects(Sandbox.getInfo(forks[0].sandboxId, { apiKey: otherKey }), NotFoundError)
  // Each fork runs in a user namespace of its own range (the source's, moved).
  const ranges = new Set()
  for (const s of [sb, ...forks]) ranges.add((await s.commands.run('cat /proc/self/uid_map')).stdout.trim().split(/\s+/)[1])
  assert.equal(ranges.size, 3, `uid ranges ${[...ranges]}`)
})

test('DeltaBox checkpoints and rollback from E2B code', async (t) => {
  const sb = await create(t)
  await sb.files.write('/tmp/state.txt', 'v1')
  const ck = await deltabox(sb.sandboxId, 'checkpoints', { message: 'before v2' })
  assert.equal(ck.status, 201)
  await sb.files.write('/tmp/state.txt', 'v2')
  await sb.commands.run('touch /tmp/new-after-checkpoint')
  const rb = await deltabox(sb.sandboxId, 'rollback', { to: ck.body.checkpoint })
  assert.equal(rb.status, 200, JSON.stringify(rb.body))
  assert.equal(await sb.files.read('/tmp/state.txt'), 'v1')
  assert.equal(await sb.files.exists('/tmp/new-after-checkpoint'), false)
  const other = await deltabox(sb.sandboxId, 'checkpoints', undefined, otherKey)
  assert.equal(other.status, 404, "another tenant's key cannot list the checkpoints")
})

test('metadata: a checkpoint before every command', async (t) => {
  const sb = await create(t, { metadata: { 'deltabox.checkpoint': 'per_command' } })
  const before = (await deltabox(sb.sandboxId, 'checkpoints')).body.length
  await sb.commands.run('echo 1 > /tmp/one')
  await sb.commands.run('echo 2 > /tmp/two')
  const cks = (await deltabox(sb.sandboxId, 'checkpoints')).body
  assert.equal(cks.length, before + 2)
  const rb = await deltabox(sb.sandboxId, 'rollback', { to: cks[cks.length - 1].checkpoint })
  assert.equal(rb.status, 200)
  assert.equal(await sb.files.exists('/tmp/two'), false, 'the rollback undid the last command')
  assert.equal(await sb.files.exists('/tmp/one'), true)
})

// viaProxy asks the egress proxy for http://example.com/ and prints its status line (busybox's
// wget cannot resolve names in this static image).
const viaProxy = 'p=${HTTP_PROXY#http://}; printf "GET http://example.com/ HTTP/1.1\\r\\nHost: example.com\\r\\nConnection: close\\r\\n\\r\\n" | nc -w 5 ${p%:*} ${p##*:} | head -1'

test('metadata: the egress policy of the sandbox', async (t) => {
  const deny = 'version: 1\ndefault: deny\nrules: []\n'
  const sb = await create(t, { metadata: { 'deltabox.egress_policy': deny } })
  const r = await sb.commands.run(viaProxy)
  assert.match(r.stdout, /403|[Ff]orbidden|denied/, 'the proxy refused the request under the deny policy')
  const offline = await create(t, { allowInternetAccess: false })
  const r2 = await offline.commands.run(viaProxy)
  assert.match(r2.stdout, /403|[Ff]orbidden|denied/, 'allowInternetAccess: false is a deny-all policy')
  const online = await create(t)
  const r3 = await online.commands.run(viaProxy)
  assert.match(r3.stdout, /^HTTP\/1\.1 /, JSON.stringify(r3.stdout))
  assert.doesNotMatch(r3.stdout, /403/, 'the pool itself passes GETs: the refusals above are the policies')
  await assert.rejects(create(t, { metadata: { 'deltabox.egress_policy': 'version: 1\ndefault: sideways\n' } }), /400.*egress policy/)
  await assert.rejects(create(t, { metadata: { 'deltabox.checkpoint': 'sometimes' } }), /400.*deltabox.checkpoint/)
})

test('commands as a named user; octet-stream uploads', async (t) => {
  const sb = await create(t)
  assert.equal((await sb.commands.run('id -u', { user: 'root' })).stdout, '0\n')
  await assert.rejects(sb.commands.run('true', { user: 'no-such-user' }), CommandExitError)
  await sb.files.write('/tmp/octet.bin', 'octets', { useOctetStream: true })
  assert.equal(await sb.files.read('/tmp/octet.bin'), 'octets')
})

test('bad input: wrong key, unknown template, another tenant', async (t) => {
  await assert.rejects(Sandbox.create(template, { apiKey: 'not-a-key-of-this-gateway' }), AuthenticationError)
  await assert.rejects(Sandbox.create('no-such-pool'), (err) => {
    assert.ok(err instanceof SandboxError)
    assert.match(err.message, /404.*no-such-pool/)
    return true
  })
  const sb = await create(t)
  await assert.rejects(Sandbox.getInfo(sb.sandboxId, { apiKey: otherKey }), NotFoundError)
  await assert.rejects(Sandbox.connect(sb.sandboxId, { apiKey: otherKey }), NotFoundError)
  assert.equal(await Sandbox.kill(sb.sandboxId, { apiKey: otherKey }), false)
  const theirs = await Sandbox.list({ apiKey: otherKey }).nextItems()
  assert.ok(!theirs.some((s) => s.sandboxId === sb.sandboxId), "the other tenant's list is its own")
  assert.equal((await sb.commands.run('echo still-here')).stdout, 'still-here\n')
})

test('snapshots: create, list, start a sandbox from one, delete', async (t) => {
  const sb = await create(t, {}, process.env.DELTABOX_E2B_FORK_TEMPLATE)
  await sb.files.write('/tmp/snap.txt', 'in the snapshot')
  const snap = await sb.createSnapshot({ name: 'e2b-test-snap' })
  assert.match(snap.snapshotId, /\S/)
  assert.deepEqual(snap.names, ['e2b-test-snap'])
  await sb.files.write('/tmp/snap.txt', 'after the snapshot')
  const listed = await Sandbox.listSnapshots({ sandboxId: sb.sandboxId }).nextItems()
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])
  assert.deepEqual(await Sandbox.listSnapshots({ apiKey: otherKey }).nextItems(), [], "the other tenant's list is its own")
  for (const ref of [snap.snapshotId, 'e2b-test-snap']) {
    const copy = await create(t, {}, ref)
    assert.equal(await copy.files.read('/tmp/snap.txt'), 'in the snapshot')
  }
  await assert.rejects(Sandbox.create('e2b-test-snap', { apiKey: otherKey }), /404/)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  await assert.rejects(Sandbox.create('e2b-test-snap'), /404/)
})

// ptyScreen collects what a terminal shows (pty.create's onData) and waits for patterns in it.
function ptyScreen() {
  const dec = new TextDecoder()
  const s = {
    text: '',
    onData: (d) => { s.text += dec.decode(d, { stream: true }) },
    async waitFor(re) {
      await waitFor(`${re} on the terminal (it shows ${JSON.stringify(s.text)})`, () => re.test(s.text), 15000)
      return s.text.match(re)
    },
  }
  return s
}

test('pty: a terminal: tty, pid, resize, input, connect, exit code', async (t) => {
  const sb = await create(t)
  const scr = ptyScreen()
  const term = await sb.pty.create({ cols: 80, rows: 24, onData: scr.onData })
  assert.ok(term.pid > 0)
  const type = (s) => sb.pty.sendInput(term.pid, new TextEncoder().encode(s))
  await type('tty; echo "pid=$$ size=$(stty size)"\n')
  await scr.waitFor(/\/dev\/pts\/\d+\r\n/)
  const [, pid, size] = await scr.waitFor(/pid=(\d+) size=(\d+ \d+)/)
  assert.equal(Number(pid), term.pid, "the pid the gateway reports is the shell's own ($$)")
  assert.equal(size, '24 80')
  assert.ok((await sb.commands.list()).some((p) => p.pid === term.pid), 'commands.list shows the terminal')
  await sb.pty.resize(term.pid, { cols: 132, rows: 50 })
  await type('echo "now=$(stty size)"\n')
  assert.equal((await scr.waitFor(/now=(\d+ \d+)/))[1], '50 132')
  const seen = ptyScreen()
  const again = await sb.pty.connect(term.pid, { onData: seen.onData })
  assert.equal(again.pid, term.pid)
  await type('echo hi\n')
  await scr.waitFor(/\nhi\r\n/)
  await seen.waitFor(/\nhi\r\n/) // a second stream on the same terminal sees it too
  await again.disconnect()
  await type('exit 3\n')
  await assert.rejects(term.wait(), (err) => {
    assert.ok(err instanceof CommandExitError, String(err))
    assert.equal(err.exitCode, 3)
    return true
  })
})

test('pty: kill, and closing its input types EOF', async (t) => {
  const sb = await create(t)
  const killed = await sb.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await sb.pty.kill(killed.pid), true)
  await assert.rejects(killed.wait(), (err) => err instanceof CommandExitError && err.exitCode !== 0)
  assert.equal(await sb.pty.kill(killed.pid), false, 'killing a gone terminal reports false')
  const scr = ptyScreen()
  const term = await sb.pty.create({ cols: 80, rows: 24, onData: scr.onData })
  await sb.pty.sendInput(term.pid, new TextEncoder().encode('echo ready\n'))
  await scr.waitFor(/\nready\r\n/)
  await sb.commands.closeStdin(term.pid) // Ctrl-D: the shell reading its next line exits
  assert.equal((await term.wait()).exitCode, 0)
})

test('signals and pids: SIGTERM reaches a trapping command; pids are the sandbox pids', async (t) => {
  const sb = await create(t)
  const out = []
  const h = await sb.commands.run("trap 'echo got TERM; exit 7' TERM; echo ready; sleep 100", {
    background: true, onStdout: (d) => out.push(d),
  })
  await waitFor('the trap to be set', () => out.join('').includes('ready'))
  const ps = await sb.commands.run('ps')
  assert.match(ps.stdout, new RegExp(`^\\s*${h.pid}\\s.*sleep 100`, 'm'), 'ps in the sandbox shows the pid commands.run gave')
  // The public SDK only kills (SIGKILL); its Connect client sends any signal of the protocol:
  // Signal.SIGTERM (15) through the same SendSignal call commands.kill makes.
  await sb.commands.rpc.sendSignal({ process: { selector: { case: 'pid', value: h.pid } }, signal: 15 })
  await assert.rejects(h.wait(), (err) => {
    assert.ok(err instanceof CommandExitError, String(err))
    assert.equal(err.exitCode, 7)
    assert.match(err.stdout, /got TERM/)
    return true
  })
  const self = await sb.commands.run('echo $$', { background: true })
  assert.equal((await self.wait()).stdout.trim(), String(self.pid), 'a command sees the pid the gateway reports as its $$')
})

// Times E2B SDK calls against DeltaBox's E2B-compatible API next to the DeltaBox TypeScript
// SDK's own calls, in the same Node process and the same run, in alternating rounds:
//   create:  Sandbox.create(template)      vs  client.lease(pool)        (kill/release untimed)
//   run:     sandbox.commands.run('true')  vs  sandbox.exec(['true'])    (on one sandbox each)
// Usage: node bench.mjs ITERATIONS ROUNDS; prints one JSON object of microsecond samples.
// Environment: E2B_* (as for the test suite), NODE_PATH-like DELTABOX_E2B_NODE_PATH,
// DELTABOX_ADDRESS (the daemon's socket), DELTABOX_TS_SDK (sdk/typescript/dist/index.js),
// DELTABOX_E2B_TEMPLATE (the pool).
import { createRequire } from 'node:module'
import { performance } from 'node:perf_hooks'

const require = createRequire(process.env.DELTABOX_E2B_NODE_PATH.replace(/\/?$/, '/'))
const { Sandbox } = require('e2b')
const { Client } = await import(process.env.DELTABOX_TS_SDK)

const n = Number(process.argv[2] ?? 20)
const rounds = Number(process.argv[3] ?? 4)
const pool = process.env.DELTABOX_E2B_TEMPLATE
const client = new Client()
const out = { e2b_create_us: [], sdk_lease_us: [], e2b_run_us: [], sdk_exec_us: [] }

async function timed(list, fn) {
  const t0 = performance.now()
  const v = await fn()
  list.push(Math.round((performance.now() - t0) * 1000))
  return v
}

// Warm both paths once (connections, JIT) before anything is timed.
{
  const sb = await Sandbox.create(pool)
  await sb.commands.run('true')
  await sb.kill()
  const l = await client.lease(pool)
  await l.exec(['true'])
  await l.release()
}

const e2bSb = await Sandbox.create(pool)
const sdkSb = await client.lease(pool)
for (let r = 0; r < rounds; r++) {
  for (let i = 0; i < n; i++) {
    await timed(out.e2b_run_us, () => e2bSb.commands.run('true'))
    await timed(out.sdk_exec_us, () => sdkSb.exec(['true']))
  }
  for (let i = 0; i < n; i++) {
    const sb = await timed(out.e2b_create_us, () => Sandbox.create(pool))
    await sb.kill()
    const l = await timed(out.sdk_lease_us, () => client.lease(pool))
    await l.release()
  }
}
await e2bSb.kill()
await sdkSb.release()
console.log(JSON.stringify(out))

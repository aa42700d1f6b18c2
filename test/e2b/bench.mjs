// Timed loops of the official E2B SDK against a real boxrt, run by the
// bench (test/bench/e2b.go). It reads E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY as any E2B user's code does.
//
//   node bench.mjs create N   # N × Sandbox.create → first stdout of commands.run('echo hi')
//   node bench.mjs run N      # one sandbox, N × commands.run('true') after 3 warm-up runs
//
// It prints one JSON array of milliseconds on stdout, and exits non-zero
// on the first failure.
import { Sandbox } from 'e2b'

const [mode, nArg] = process.argv.slice(2)
const n = Number(nArg)
if (!['create', 'run'].includes(mode) || !(n > 0)) {
  console.error('usage: node bench.mjs create|run N')
  process.exit(2)
}

const samples = []
if (mode === 'create') {
  for (let i = 0; i < n; i++) {
    const t0 = performance.now()
    const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
    let first
    const res = await sbx.commands.run('echo hi', { onStdout: () => { first ??= performance.now() } })
    if (res.stdout !== 'hi\n' || first === undefined) throw new Error(`echo hi gave ${JSON.stringify(res)}`)
    samples.push(first - t0)
    await sbx.kill()
  }
} else {
  const sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
  try {
    for (let i = 0; i < 3; i++) await sbx.commands.run('true')
    for (let i = 0; i < n; i++) {
      const t0 = performance.now()
      await sbx.commands.run('true')
      samples.push(performance.now() - t0)
    }
  } finally {
    await sbx.kill()
  }
}
console.log(JSON.stringify(samples))

// The E2B SDK scenario test/e2b_test.go runs against a real boxrt. It
// reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY as any E2B user's
// code does, prints "ok <step>" per step and exits non-zero on the first
// failure.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox, CommandExitError, AuthenticationError, TimeoutError, ALL_TRAFFIC } from 'e2b'

const step = async (name, fn) => {
  await fn()
  console.log('ok ' + name)
}

const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })

await step('stdout arrives while the command runs', async () => {
  const seen = []
  const started = Date.now()
  const res = await sbx.commands.run('echo first; sleep 1.5; echo second >&2', {
    onStdout: (d) => seen.push({ d, at: Date.now() - started }),
    onStderr: (d) => seen.push({ d, at: Date.now() - started }),
  })
  const done = Date.now() - started
  assert.equal(res.exitCode, 0)
  assert.equal(res.stdout, 'first\n')
  assert.equal(res.stderr, 'second\n')
  assert.equal(seen[0].d, 'first\n')
  assert.ok(done - seen[0].at >= 1000, `first output at ${seen[0].at} ms, end at ${done} ms`)
})

await step('CommandExitError carries the exit code', async () => {
  await assert.rejects(sbx.commands.run('echo oops >&2; exit 7'), (e) => {
    assert.ok(e instanceof CommandExitError, String(e))
    assert.equal(e.exitCode, 7)
    assert.equal(e.stderr, 'oops\n')
    return true
  })
})

await step('background command with stdin', async () => {
  const h = await sbx.commands.run('read a; echo got:$a; cat', { background: true, stdin: true })
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), JSON.stringify(listed))
  await sbx.commands.sendStdin(h.pid, 'one\n')
  await sbx.commands.sendStdin(h.pid, 'two\n')
  await sbx.commands.closeStdin(h.pid)
  const res = await h.wait()
  assert.equal(res.stdout, 'got:one\ntwo\n')
})

await step('kill', async () => {
  const h = await sbx.commands.run('sleep 300', { background: true })
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(999999), false)
})

await step('timeoutMs ends the command', async () => {
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1500 }), TimeoutError)
  let left = []
  for (let i = 0; i < 50; i++) {
    left = (await sbx.commands.list()).filter((p) => p.args.includes('sleep 30'))
    if (left.length === 0) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.deepEqual(left, [])
})

await step('pty: stty size, resize', async () => {
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ rows: 24, cols: 80, onData: (d) => { out += dec.decode(d) } })
  const enc = new TextEncoder()
  await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'))
  // The shell reads its input when it gets to it: resize only after the
  // first answer.
  for (let i = 0; i < 100 && !/24 80/.test(out); i++) await new Promise((r) => setTimeout(r, 100))
  await sbx.pty.resize(term.pid, { rows: 30, cols: 100 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size; exit\n'))
  await term.wait()
  assert.match(out, /24 80/, out)
  assert.match(out, /30 100/, out)
})

await step('files write and read', async () => {
  await sbx.files.write('/tmp/e2b/hello.txt', 'hello from the SDK\n')
  assert.equal(await sbx.files.read('/tmp/e2b/hello.txt'), 'hello from the SDK\n')
  const blob = randomBytes(3 << 20)
  await sbx.files.write('/tmp/e2b/blob.bin', blob)
  const back = await sbx.files.read('/tmp/e2b/blob.bin', { format: 'bytes' })
  assert.ok(Buffer.from(back).equals(blob), 'binary round trip')
  const sum = await sbx.commands.run('wc -c < /tmp/e2b/blob.bin')
  assert.equal(sum.stdout.trim(), String(blob.length))
})

await step("the user's files are in /home/user, the commands' cwd and HOME", async () => {
  await sbx.files.write('/home/user/notes.txt', 'kept\n')
  const r = await sbx.commands.run('pwd; echo $HOME; cat notes.txt; cat ~/notes.txt')
  assert.equal(r.stdout, '/home/user\n/home/user\nkept\nkept\n')
})

await step("a command is its own login shell: bash -l reads ~/.bash_profile, sh's ~/.profile stays out, as in E2B", async () => {
  await sbx.files.write('/home/user/.profile', 'export VIA_PROFILE=sh\n')
  await sbx.files.write('/home/user/.bash_profile', 'export VIA_BASH_PROFILE=bash\n')
  const r = await sbx.commands.run('echo "${VIA_PROFILE:-none} ${VIA_BASH_PROFILE:-none}"; shopt -q login_shell && echo login')
  await sbx.files.remove('/home/user/.profile')
  await sbx.files.remove('/home/user/.bash_profile')
  assert.equal(r.stdout, 'none bash\nlogin\n')
})

await step('files list, exists, makeDir, rename, remove', async () => {
  assert.equal(await sbx.files.makeDir('/tmp/e2b/dir'), true)
  assert.equal(await sbx.files.makeDir('/tmp/e2b/dir'), false)
  const names = (await sbx.files.list('/tmp/e2b')).map((e) => e.name).sort()
  assert.deepEqual(names, ['blob.bin', 'dir', 'hello.txt'])
  const info = await sbx.files.getInfo('/tmp/e2b/hello.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.size, 19)
  await sbx.files.rename('/tmp/e2b/hello.txt', '/tmp/e2b/dir/moved.txt')
  assert.equal(await sbx.files.exists('/tmp/e2b/hello.txt'), false)
  assert.equal(await sbx.files.exists('/tmp/e2b/dir/moved.txt'), true)
  await sbx.files.remove('/tmp/e2b/dir')
  assert.equal(await sbx.files.exists('/tmp/e2b/dir'), false)
})

await step('watchDir events', async () => {
  await sbx.files.makeDir('/tmp/e2b/watched')
  const events = []
  const handle = await sbx.files.watchDir('/tmp/e2b/watched', (e) => events.push(e), { recursive: true })
  await sbx.files.write('/tmp/e2b/watched/new.txt', 'x')
  await sbx.commands.run('mkdir /tmp/e2b/watched/sub && echo y > /tmp/e2b/watched/sub/deep.txt')
  for (let i = 0; i < 100 && !events.some((e) => e.name === 'sub/deep.txt'); i++) await new Promise((r) => setTimeout(r, 100))
  await handle.stop()
  assert.ok(events.some((e) => e.name === 'new.txt' && e.type === 'create'), JSON.stringify(events))
  assert.ok(events.some((e) => e.name === 'sub/deep.txt' && e.type === 'create'), JSON.stringify(events))
})

await step('Sandbox.list and getInfo', async () => {
  const items = await Sandbox.list().nextItems()
  assert.ok(items.some((s) => s.sandboxId === sbx.sandboxId), JSON.stringify(items))
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
})

await step('a second handle connects', async () => {
  const other = await Sandbox.connect(sbx.sandboxId)
  const res = await other.commands.run('cat /tmp/e2b/blob.bin | wc -c')
  assert.equal(res.stdout.trim(), String(3 << 20))
})

await step('fork copies the files', async () => {
  const [forked] = await sbx.fork()
  assert.ok(forked instanceof Sandbox, String(forked))
  assert.notEqual(forked.sandboxId, sbx.sandboxId)
  const res = await forked.commands.run('wc -c < /tmp/e2b/blob.bin')
  assert.equal(res.stdout.trim(), String(3 << 20))
  await forked.kill()
})

await step('snapshot, then create from it', async () => {
  const snap = await sbx.createSnapshot()
  assert.ok(snap.snapshotId, JSON.stringify(snap))
  const restored = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
  const res = await restored.commands.run('wc -c < /tmp/e2b/blob.bin')
  assert.equal(res.stdout.trim(), String(3 << 20))
  await restored.kill()
})

await step('setTimeout: the sandbox is killed when it passes', async () => {
  const short = await Sandbox.create('base', { timeoutMs: 60_000 })
  await short.setTimeout(1_000)
  await new Promise((r) => setTimeout(r, 2_500))
  assert.equal(await short.isRunning(), false)
  assert.equal(await Sandbox.kill(short.sandboxId), false)
})

await step('pause, then connect resumes with the files kept', async () => {
  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await resumed.getInfo()).state, 'running')
  const res = await resumed.commands.run('wc -c < /tmp/e2b/blob.bin')
  assert.equal(res.stdout.trim(), String(3 << 20))
})

await step('network: allowOut with everything else denied, then updateNetwork', async () => {
  // boxrt's egress.hosts (test/e2b_test.go) names api.test and other.test;
  // the sandbox's resolver answers only the names its policy allows.
  const net = await Sandbox.create('base', { timeoutMs: 60_000, network: { allowOut: ['api.test'], denyOut: [ALL_TRAFFIC] } })
  try {
    assert.match((await net.commands.run('getent hosts api.test')).stdout, /203\.0\.113\.10/)
    await assert.rejects(net.commands.run('getent hosts other.test'), CommandExitError)
    await net.updateNetwork({ allowOut: ['other.test'], denyOut: [ALL_TRAFFIC] })
    assert.match((await net.commands.run('getent hosts other.test')).stdout, /203\.0\.113\.11/)
    await assert.rejects(net.commands.run('getent hosts api.test'), CommandExitError)
  } finally {
    await net.kill()
  }
  await assert.rejects(Sandbox.create('base', { network: { denyOut: ['10.0.0.0/8'] } }), /denyOut/)
})

await step('a wrong API key is an AuthenticationError', async () => {
  await assert.rejects(Sandbox.create('base', { apiKey: 'e2b_' + 'f'.repeat(40) }), AuthenticationError)
  await assert.rejects(Sandbox.list({ apiKey: 'wrong' }).nextItems(), AuthenticationError)
})

await step('kill the sandbox, then connect fails', async () => {
  await sbx.kill()
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await assert.rejects(Sandbox.connect(sbx.sandboxId))
})
console.log('scenario done')

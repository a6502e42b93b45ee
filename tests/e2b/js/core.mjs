// The unmodified E2B JS SDKs against Paddock, configured only by E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY (run by tests/e2b/test_edge_js.py). Prints one JSON line of what it saw; any failed
// check throws, and the process exits non-zero.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'

const seen = {}

const sandbox = await Sandbox.create({ timeoutMs: 300_000 })
try {
  // commands: streaming, envs, a failure, stdin, background and kill
  const chunks = []
  const run = await sandbox.commands.run('echo one; sleep 0.5; echo two >&2; echo $GREETING', {
    envs: { GREETING: 'hi' },
    onStdout: (data) => chunks.push(data),
  })
  assert.equal(run.exitCode, 0)
  assert.equal(run.stdout, 'one\nhi\n')
  assert.equal(run.stderr, 'two\n')
  assert.ok(chunks.join('') === 'one\nhi\n')
  seen.run = run.stdout

  await assert.rejects(sandbox.commands.run('exit 3'), (err) => err instanceof CommandExitError && err.exitCode === 3)

  const cat = await sandbox.commands.run('cat', { background: true, stdin: true })
  await sandbox.commands.sendStdin(cat.pid, 'hello\n')
  await sandbox.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'hello\n')

  const sleeper = await sandbox.commands.run('sleep 600', { background: true })
  assert.ok((await sandbox.commands.list()).some((p) => p.pid === sleeper.pid))
  assert.equal(await sandbox.commands.kill(sleeper.pid), true)
  assert.equal(await sandbox.commands.kill(sleeper.pid), false)

  // files: 5 MiB round trip, list, stat, remove, a missing file
  const blob = new Uint8Array(5 << 20)
  for (let i = 0; i < blob.length; i++) blob[i] = (i * 7919) & 0xff
  await sandbox.files.write('/tmp/js/blob.bin', blob.buffer)
  const back = await sandbox.files.read('/tmp/js/blob.bin', { format: 'bytes' })
  assert.equal(back.length, blob.length)
  assert.ok(Buffer.from(back).equals(Buffer.from(blob)))
  await sandbox.files.write('/tmp/js/a.txt', 'text from js')
  assert.equal(await sandbox.files.read('/tmp/js/a.txt'), 'text from js')
  const names = (await sandbox.files.list('/tmp/js')).map((e) => e.name).sort()
  assert.deepEqual(names, ['a.txt', 'blob.bin'])
  assert.equal((await sandbox.files.getInfo('/tmp/js/a.txt')).size, 12)
  await sandbox.files.remove('/tmp/js/a.txt')
  assert.equal(await sandbox.files.exists('/tmp/js/a.txt'), false)
  await assert.rejects(sandbox.files.read('/tmp/js/none'), (err) => err instanceof NotFoundError)

  // a directory watch (the async SDK's WatchDir stream)
  const events = []
  const watcher = await sandbox.files.watchDir('/tmp/js', (event) => events.push(event), { timeoutMs: 0 })
  await sandbox.files.write('/tmp/js/new.txt', 'new')
  const deadline = Date.now() + 10_000
  while (!events.some((e) => e.name === 'new.txt') && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200))
  }
  await watcher.stop()
  assert.ok(events.some((e) => e.name === 'new.txt' && e.type === 'create'), JSON.stringify(events))
  seen.watch = events.map((e) => `${e.type}:${e.name}`)

  // PTY
  let out = ''
  const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: (data) => { out += new TextDecoder().decode(data) } })
  await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode('echo pty-$((6*7)); exit\n'))
  await terminal.wait()
  assert.ok(out.includes('pty-42'), out)

  // network: the egress allowlist replaced on the running sandbox, then everything denied, then cleared
  await sandbox.updateNetwork({ allowOut: ['192.0.2.1'], denyOut: ['0.0.0.0/0'] })
  const listed = (await sandbox.getInfo()).network ?? {}
  assert.deepEqual([listed.allowOut, listed.denyOut], [['192.0.2.1'], ['0.0.0.0/0']])
  // some addresses denied, the rest allowed (E2B's "deny specific IPs"): a denylist, shown as given
  await sandbox.updateNetwork({ denyOut: ['192.0.2.9', '198.51.100.0/24'], allowOut: ['198.51.100.7'] })
  const denied = (await sandbox.getInfo()).network ?? {}
  assert.deepEqual([denied.allowOut, denied.denyOut], [['198.51.100.7'], ['192.0.2.9', '198.51.100.0/24']])
  seen.denied = denied.denyOut
  await Sandbox.updateNetwork(sandbox.sandboxId, { allowInternetAccess: false })
  assert.deepEqual(((await sandbox.getInfo()).network ?? {}).allowOut, [])
  await sandbox.updateNetwork({})
  assert.equal(((await sandbox.getInfo()).network ?? {}).allowOut, undefined)
  seen.network = listed.allowOut
} finally {
  await sandbox.kill()
}

// network options at create: the Host its ports get, the ports reached over TLS, and with a domain
// allowed, E2B's default DNS server (this SDK sends no dnsServers at create) among the rules
const shaped = await Sandbox.create({
  timeoutMs: 120_000,
  network: {
    maskRequestHost: '${PORT}-js.example.test',
    httpsPorts: [8443],
    allowOut: ['api.example.test'],
    denyOut: ['0.0.0.0/0'],
  },
})
try {
  const network = (await shaped.getInfo()).network ?? {}
  assert.equal(network.maskRequestHost, '${PORT}-js.example.test')
  assert.deepEqual(network.httpsPorts, [8443])
  assert.deepEqual(network.allowOut, ['api.example.test', '8.8.8.8'])
  seen.networkOptions = [network.maskRequestHost, network.httpsPorts, network.allowOut]
} finally {
  await shaped.kill()
}

if (process.env.PADDOCK_E2B_JS_INTERPRETER === '1') {
  const code = await CodeSandbox.create({ timeoutMs: 300_000 })
  try {
    await code.runCode('x = 6 * 7')
    const again = await code.runCode('x')
    assert.equal(again.text, '42')
    const failed = await code.runCode('1 / 0')
    assert.equal(failed.error.name, 'ZeroDivisionError')
    const chart = await code.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()')
    const png = chart.results.find((r) => r.png)
    assert.ok(png && Buffer.from(png.png, 'base64').subarray(0, 4).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47])))
    seen.interpreter = again.text
    // a cell's own environment variables, gone in the next cell
    const withEnvs = await code.runCode("import os\nos.environ['JS_TOKEN']", { envs: { JS_TOKEN: 'from-js' } })
    const after = await code.runCode("'JS_TOKEN' in os.environ")
    seen.interpreterEnvs = [withEnvs.text, after.text]
  } finally {
    await code.kill()
  }
}

console.log(JSON.stringify({ ok: true, ...seen }))

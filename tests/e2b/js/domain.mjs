// The unmodified E2B JS SDKs at E2B's own addresses, without E2B_SANDBOX_URL (which they deprecate):
// envd at https://49983-<id>.<domain> and the code interpreter at https://49999-<id>.<domain>, the domain
// the API tells them, which is Paddock's ingress over TLS. Run by tests/e2b/test_domain_mode.py with
// E2B_API_URL, E2B_API_KEY and NODE_EXTRA_CA_CERTS (the CA of the ingress's certificate) set before it
// starts; `*.<domain>` resolves to 127.0.0.1 here, as a DNS record for it would (the one stand-in: the
// SDKs are unchanged). Prints one JSON line of what it saw.
//
//     node domain.mjs DOMAIN
import dns from 'node:dns'

const domain = process.argv[2]
const resolve = dns.lookup
// Node's sockets ask `dns.lookup` at connect time, so every client in this process (the SDKs' own
// undici agents among them) finds the wildcard record.
dns.lookup = (host, options, callback) => {
  if (typeof options === 'function') [callback, options] = [options, {}]
  if (typeof host === 'string' && host.endsWith(`.${domain}`)) {
    const family = 4
    return options?.all ? callback(null, [{ address: '127.0.0.1', family }]) : callback(null, '127.0.0.1', family)
  }
  return resolve(host, options, callback)
}

const { Sandbox } = await import('e2b')
const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter')

const seen = {}
const sandbox = await Sandbox.create({ timeoutMs: 300_000 })
try {
  seen.sandboxId = sandbox.sandboxId
  seen.host = sandbox.getHost(49983)
  seen.run = (await sandbox.commands.run('echo $((6 * 7))')).stdout // a server-streaming Connect call
  await sandbox.files.write('/tmp/js-domain.txt', 'through the ingress, from node')
  seen.read = await sandbox.files.read('/tmp/js-domain.txt')
  seen.listed = (await sandbox.files.list('/tmp')).map((entry) => entry.name).filter((name) => name === 'js-domain.txt')
} finally {
  await sandbox.kill()
}

const code = await CodeSandbox.create({ timeoutMs: 300_000 })
try {
  seen.runCode = (await code.runCode('x = 6 * 7\nx')).text // https://49999-<id>.<domain>/execute
} finally {
  await code.kill()
}
console.log(JSON.stringify(seen))

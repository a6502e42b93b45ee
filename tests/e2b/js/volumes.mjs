// The unmodified E2B JS SDK's volumes against Paddock, configured only by E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY, and E2B_VOLUME_API_URL for the content API (run by tests/e2b/test_api_volumes.py): a
// volume made, mounted into a sandbox that writes a file and is killed, its files read and written
// through the content API, mounted into a second sandbox that reads both files, then destroyed. Prints
// one JSON line.
import assert from 'node:assert/strict'
import { Sandbox, Volume } from 'e2b'

const seen = {}
const volume = await Volume.create(process.env.PADDOCK_E2B_VOLUME)
try {
  seen.listed = (await Volume.list()).some((v) => v.volumeId === volume.volumeId)
  const first = await Sandbox.create({ volumeMounts: { '/data': volume }, timeoutMs: 300_000 })
  try {
    seen.mounts = (await first.getInfo()).volumeMounts
    await first.files.write('/data/js.txt', 'from js\n')
  } finally {
    await first.kill()
  }
  // The content API, with the volume's token (Volume.connect gives the same one).
  seen.sameToken = (await Volume.connect(volume.volumeId)).token === volume.token
  seen.apiReadsSandbox = await volume.readFile('/js.txt')
  await volume.writeFile('/dir/api.txt', 'via the content api\n', { mode: 0o640 })
  await volume.makeDir('/made/deep', { force: true })
  seen.apiList = (await volume.list('/', { depth: 2 })).map((e) => `${e.path}:${e.type}`).sort()
  seen.apiInfo = (({ name, type, size, mode }) => ({ name, type, size, mode }))(await volume.getInfo('/dir/api.txt'))
  await volume.remove('/made')
  seen.apiRemoved = !(await volume.exists('/made'))
  const second = await Sandbox.create({ volumeMounts: { '/data': volume.name }, timeoutMs: 300_000 })
  try {
    seen.read = await second.files.read('/data/js.txt')
    seen.readApi = await second.files.read('/data/dir/api.txt')
  } finally {
    await second.kill()
  }
  seen.destroyed = await Volume.destroy(volume.volumeId)
  seen.destroyedAgain = await Volume.destroy(volume.volumeId)
  assert.equal(seen.destroyedAgain, false)
} finally {
  if (seen.destroyed !== true) await Volume.destroy(volume.volumeId).catch(() => {})
}
console.log(JSON.stringify(seen))

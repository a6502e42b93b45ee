// The unmodified E2B JS SDK's volumes against Paddock, configured only by E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY (run by tests/e2b/test_api_volumes.py): a volume made, mounted into a sandbox that
// writes a file and is killed, mounted into a second that reads it, then destroyed. Prints one JSON line.
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
  const second = await Sandbox.create({ volumeMounts: { '/data': volume.name }, timeoutMs: 300_000 })
  try {
    seen.read = await second.files.read('/data/js.txt')
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

// The unmodified E2B JS SDK's snapshots against Paddock, configured only by E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY (run by tests/e2b/test_api_snapshots.py): a sandbox writes a file and is snapshotted
// by name, then killed; a sandbox boots from the snapshot and reads the file; the listing (a page at a
// time) shows the snapshot; deleteSnapshot removes it. Prints one JSON line.
import { Sandbox } from 'e2b'

const seen = {}
const name = process.env.PADDOCK_E2B_SNAPSHOT
const source = await Sandbox.create({ timeoutMs: 300_000 })
let snapshotId
try {
  await source.files.write('/var/tmp/js.txt', 'from js\n')
  const snap = await source.createSnapshot({ name })
  snapshotId = snap.snapshotId
  seen.names = snap.names
  await source.kill()
  const copy = await Sandbox.create(snap.snapshotId, { timeoutMs: 300_000 })
  try {
    seen.read = await copy.files.read('/var/tmp/js.txt')
  } finally {
    await copy.kill()
  }
  const paginator = Sandbox.listSnapshots({ sandboxId: source.sandboxId, limit: 1 })
  const listed = []
  while (paginator.hasNext) listed.push(...(await paginator.nextItems()))
  seen.listed = listed.map((item) => item.snapshotId === snap.snapshotId)
  seen.deleted = await Sandbox.deleteSnapshot(snap.snapshotId)
  seen.deletedAgain = await Sandbox.deleteSnapshot(snap.snapshotId)
} finally {
  await Sandbox.kill(source.sandboxId).catch(() => {})
  if (seen.deleted !== true && snapshotId) await Sandbox.deleteSnapshot(snapshotId).catch(() => {})
}
console.log(JSON.stringify(seen))

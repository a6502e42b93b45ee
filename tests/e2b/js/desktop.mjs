// The unmodified @e2b/desktop SDK against Paddock's desktop:1, configured only by E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY (run by tests/e2b/test_e2b_desktop_js.py). Writes the screenshots it
// took into PADDOCK_E2B_JS_OUT (the test looks at their pixels) and prints one JSON line of what it saw;
// any failed check throws, and the process exits non-zero.
import assert from 'node:assert/strict'
import { writeFile } from 'node:fs/promises'
import { request } from 'node:http'
import { join } from 'node:path'
import { Sandbox } from '@e2b/desktop'
import { CommandExitError } from 'e2b'

const out = process.env.PADDOCK_E2B_JS_OUT
assert.ok(out, 'PADDOCK_E2B_JS_OUT names the directory for the screenshots')
const seen = {}

function pngSize(bytes) {
  const data = Buffer.from(bytes)
  assert.ok(data.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'a PNG')
  assert.equal(data.subarray(12, 16).toString('latin1'), 'IHDR')
  return { width: data.readUInt32BE(16), height: data.readUInt32BE(20) }
}

async function save(name, bytes) {
  await writeFile(join(out, name), Buffer.from(bytes))
}

// GET of the SDK's stream URL: its host, path and query, sent to the ingress's listener on 127.0.0.1
// (the test platform's ingress speaks plain HTTP; `paddock serve` serves the same names over HTTPS).
function throughIngress(url) {
  const parsed = new URL(url)
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port: +parsed.port, path: parsed.pathname + parsed.search, headers: { host: parsed.host } },
      (res) => {
        let body = ''
        res.on('data', (chunk) => { body += chunk })
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }))
      },
    )
    req.on('error', reject)
    req.end()
  })
}

async function mousepadWindow(desktop) {
  const deadline = Date.now() + 30_000
  while (Date.now() < deadline) {
    try {
      const windows = (await desktop.getApplicationWindows('mousepad')).filter((w) => w)
      if (windows.length) return windows[windows.length - 1]
    } catch (err) {
      if (!(err instanceof CommandExitError)) throw err // xdotool search exits 1 until the window is there
    }
    await new Promise((r) => setTimeout(r, 500))
  }
  throw new Error('no Mousepad window appeared within 30 s')
}

const started = Date.now()
// the default template: desktop; waits for XFCE. Public traffic: its stream URL opens through the ingress
const desktop = await Sandbox.create({ timeoutMs: 600_000, network: { allowPublicTraffic: true } })
seen.createSeconds = (Date.now() - started) / 1000
try {
  seen.templateId = (await desktop.getInfo()).templateId
  seen.sandboxId = desktop.sandboxId
  const size = await desktop.getScreenSize()
  seen.screenSize = size

  // xfdesktop paints its backdrop soon after it starts; until then the screen is black but for the
  // pointer (a PNG of a few KiB). The test checks the colours of the last shot.
  let shot
  const painted = Date.now() + 15_000
  do {
    shot = await desktop.screenshot()
    assert.ok(shot instanceof Uint8Array)
    assert.deepEqual(pngSize(shot), size)
  } while (shot.length < 32_768 && Date.now() < painted && (await desktop.wait(1000), true))
  await save('desktop.png', shot)

  await desktop.moveMouse(300, 200)
  assert.deepEqual(await desktop.getCursorPosition(), { x: 300, y: 200 })
  await desktop.moveMouse(700, 500)
  seen.cursor = await desktop.getCursorPosition()

  // a click into a Mousepad window, then typing
  await (await desktop.commands.run('mousepad', { background: true, timeoutMs: 0 })).disconnect()
  const window = await mousepadWindow(desktop)
  const geometry = (await desktop.commands.run(`xdotool getwindowgeometry --shell ${window}`)).stdout
  const fields = Object.fromEntries(geometry.split(/\s+/).filter((l) => l.includes('=')).map((l) => l.split('=', 2)))
  const box = { x: +fields.X, y: +fields.Y, width: +fields.WIDTH, height: +fields.HEIGHT }
  seen.window = box
  const [x, y] = [box.x + Math.floor(box.width / 2), box.y + Math.floor(box.height / 2)]
  await desktop.moveMouse(5, 5) // the pointer out of the way, so that only the window's text differs
  await desktop.wait(500)
  await save('before.png', await desktop.screenshot())
  await desktop.leftClick(x, y)
  assert.deepEqual(await desktop.getCursorPosition(), { x, y })
  await desktop.write('hi from js')
  await desktop.press('enter')
  await desktop.write('there')
  await desktop.wait(500)
  seen.title = await desktop.getWindowTitle(window)
  await desktop.moveMouse(5, 5)
  await desktop.wait(500)
  await save('after.png', await desktop.screenshot())

  if (process.env.PADDOCK_URL) {
    // the stream: the desktop was made with public traffic, so its 6080 (where @e2b/desktop 2.4.0's
    // stream always is: it builds its noVNC command in the constructor) is an ordinary ingress port;
    // noVNC's own password (requireAuth) guards the screen (docs/e2b.md)
    await desktop.stream.start({ requireAuth: true })
    const url = desktop.stream.getUrl({ authKey: desktop.stream.getAuthKey() })
    seen.streamUrl = url.replace(desktop.stream.getAuthKey(), '<key>')
    const page = await throughIngress(url)
    assert.equal(page.status, 200, page.body.slice(0, 300))
    assert.ok(page.body.includes('class="noVNC_loading"'), page.body.slice(0, 300))
    await desktop.stream.stop()
    seen.stream = 'ok'
  }
} finally {
  await desktop.kill()
}
seen.killed = !(await desktop.isRunning())
seen.ok = true
console.log(JSON.stringify(seen))

// E2B's own JavaScript SDK (@e2b/code-interpreter), unchanged, against the gateway's /e2b.
// tests/integration/test_e2b_sdks.py starts a gateway on the docker backend and runs this file with
// `node --test`, with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at it.
import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'

import { Sandbox } from '@e2b/code-interpreter'
import { AuthenticationError, CommandExitError, NotFoundError, SandboxError } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  assert.ok(process.env[name], `${name} must point at the gateway`)
}

const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const plain = (text) => text.replace(/\x1b\[[0-9;]*m/g, '') // tracebacks are colored, as E2B's

describe('one sandbox', () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create({ timeoutMs: 120_000 })
  })
  after(async () => {
    await sbx?.kill()
  })

  test('state, live stdout, a chart, an error', async () => {
    assert.equal((await sbx.runCode('x = 41')).error, undefined)
    assert.equal((await sbx.runCode('x + 1')).text, '42')
    const arrivals = []
    const started = Date.now()
    const live = await sbx.runCode(
      "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')",
      { onStdout: (out) => arrivals.push([Date.now() - started, out.line]) },
    )
    assert.deepEqual(live.logs.stdout, ['first\n', 'second\n'])
    assert.equal(arrivals.length, 2)
    assert.ok(arrivals[1][0] - arrivals[0][0] > 1500, JSON.stringify(arrivals)) // the first came live
    const chart = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
    assert.ok(Buffer.from(chart.results[0].png, 'base64').subarray(0, 8).equals(PNG_MAGIC))
    const failed = await sbx.runCode('1 / 0')
    assert.equal(failed.error.name, 'ZeroDivisionError')
    assert.match(plain(failed.error.traceback), /1 \/ 0/)
    assert.equal((await sbx.runCode('x')).text, '41') // the kernel lives on
  })

  test('files both ways', async () => {
    await sbx.files.write('/home/user/data/in.csv', 'a,b\n1,2\n')
    const sum = await sbx.runCode("import pandas as pd\nprint(pd.read_csv('data/in.csv').sum().sum())")
    assert.deepEqual(sum.logs.stdout, ['3\n'])
    await sbx.runCode("open('out.txt', 'w').write('from the kernel')")
    assert.equal(await sbx.files.read('out.txt'), 'from the kernel')
    const bytes = await sbx.files.read('/home/user/out.txt', { format: 'bytes' })
    assert.equal(Buffer.from(bytes).toString(), 'from the kernel')
    const names = (await sbx.files.list('/home/user')).map((entry) => entry.name)
    assert.ok(names.includes('data') && names.includes('out.txt'), names.join(','))
    assert.equal(await sbx.files.exists('out.txt'), true)
    assert.equal(await sbx.files.exists('nope.txt'), false)
    await assert.rejects(sbx.files.read('missing.txt'), NotFoundError)
  })

  test('commands: exit codes, streamed output, the same files', async () => {
    const done = await sbx.commands.run('echo hello; echo oops >&2; pwd; id -u')
    assert.equal(done.exitCode, 0)
    assert.deepEqual(done.stdout.split(/\s+/).filter(Boolean), ['hello', '/home/user', '1000'])
    assert.equal(done.stderr, 'oops\n')
    await assert.rejects(sbx.commands.run('exit 3'), (err) => err instanceof CommandExitError && err.exitCode === 3)
    const seen = []
    const started = Date.now()
    await sbx.commands.run('echo one; sleep 2; echo two', {
      onStdout: (line) => seen.push([Date.now() - started, line.trim()]),
    })
    assert.deepEqual(seen.map(([, line]) => line), ['one', 'two'])
    assert.ok(seen[1][0] - seen[0][0] > 1500) // streamed, not collected at the end
    await sbx.commands.run('echo made-by-bash > from-bash.txt')
    assert.deepEqual((await sbx.runCode("print(open('from-bash.txt').read())")).logs.stdout, ['made-by-bash\n\n'])
    const background = await sbx.commands.run('sleep 60', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === background.pid))
    assert.equal(await sbx.commands.kill(background.pid), true)
    // its stream ends with the signal at once, not after 60 s
    await assert.rejects(background.wait(), (err) => err instanceof CommandExitError && /killed/.test(err.error))
    assert.ok(!(await sbx.commands.list()).some((p) => p.pid === background.pid))
    assert.equal(await sbx.commands.kill(999999), false)
  })

  test('contexts are namespaces of their own on the same files', async () => {
    await sbx.runCode("x = 'default'")
    const other = await sbx.createCodeContext()
    assert.equal(other.language, 'python')
    assert.equal(other.cwd, '/home/user')
    await sbx.runCode("x = 'other'", { context: other })
    assert.equal((await sbx.runCode('x')).text, 'default')
    assert.equal((await sbx.runCode('x', { context: other })).text, 'other')
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === other.id))
    await sbx.removeCodeContext(other)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === other.id))
  })

  test('envs apply to one execution', async () => {
    const shown = await sbx.runCode("import os; os.environ['ONLY_NOW']", { envs: { ONLY_NOW: 'yes' } })
    assert.equal(shown.text, 'yes')
    assert.equal((await sbx.runCode("import os; os.environ.get('ONLY_NOW', 'gone')")).text, 'gone')
  })
})

test('connect, list, pause and resume, set timeout and expiry', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 60_000, metadata: { owner: 'js-tests' } })
  try {
    await sbx.runCode("kept = 'yes'")
    const again = await Sandbox.connect(sbx.sandboxId) // a second client
    assert.equal((await again.runCode('kept')).text, 'yes')
    const listed = (await Sandbox.list().nextItems()).map((s) => s.sandboxId)
    assert.ok(listed.includes(sbx.sandboxId))
    const info = await sbx.getInfo()
    assert.deepEqual(info.metadata, { owner: 'js-tests' })
    assert.equal(info.state, 'running')
    await sbx.pause()
    assert.equal((await sbx.getInfo()).state, 'paused')
    const resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await resumed.runCode('kept')).text, 'yes') // a paused sandbox keeps its variables
    await sbx.setTimeout(2_000)
    const deadline = Date.now() + 15_000
    while (await sbx.isRunning()) {
      assert.ok(Date.now() < deadline, 'the sandbox outlived its timeout')
      await sleep(500)
    }
    await assert.rejects(sbx.getInfo(), SandboxError)
  } finally {
    await sbx.kill()
  }
  assert.equal(await Sandbox.kill(sbx.sandboxId), false) // already gone
})

test('a killed sandbox says so', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 60_000 })
  await sbx.runCode('x = 1')
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(sbx.runCode('x'), /not found/i)
  await assert.rejects(sbx.commands.run('true'), SandboxError)
})

test('a wrong API key is an authentication error', async () => {
  await assert.rejects(Sandbox.create({ apiKey: 'not-the-token' }), AuthenticationError)
})

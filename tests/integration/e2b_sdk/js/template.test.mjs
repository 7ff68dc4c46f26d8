// E2B's template SDK (`Template`, exported by `e2b` and re-exported by @e2b/code-interpreter),
// unchanged, against the gateway's /e2b: a template built with `Template.build`, then a sandbox
// started from it. tests/integration/test_e2b_sdks.py runs this file with `node --test`
// beside sdk.test.mjs, with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, test } from 'node:test'

import { Sandbox, Template } from '@e2b/code-interpreter'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  assert.ok(process.env[name], `${name} must point at the gateway`)
}

const name = `js-template-${randomUUID().slice(0, 8)}`

after(async () => {
  // E2B's SDKs have no call that deletes a template: E2B's API has, and so has the gateway.
  const deleted = await fetch(`${process.env.E2B_API_URL}/templates/${name}`, {
    method: 'DELETE',
    headers: { 'X-API-KEY': process.env.E2B_API_KEY },
  })
  assert.equal(deleted.status, 204, await deleted.text())
  assert.equal(await Template.exists(name), false)
})

test('Template.build makes a template that sandboxes start from', async () => {
  const template = Template()
    .fromBaseImage()
    .runCmd('echo hi > /opt/marker', { user: 'root' }) // steps run as the image's user, as on E2B
    .setEnvs({ A: '1' })
  const logs = []
  const info = await Template.build(template, name, { onBuildLogs: (entry) => logs.push(entry.message) })
  assert.equal(info.name, name)
  assert.ok(logs.length > 0, 'no build logs came')
  assert.equal(await Template.exists(name), true)
  const sbx = await Sandbox.create(name, { timeoutMs: 120_000 })
  try {
    const seen = await sbx.runCode("import os\nprint(open('/opt/marker').read().strip(), os.environ['A'])")
    assert.equal(seen.error, undefined)
    assert.deepEqual(seen.logs.stdout, ['hi 1\n'])
    assert.equal((await sbx.commands.run('cat /opt/marker; echo "A=$A"')).stdout, 'hi\nA=1\n')
  } finally {
    await sbx.kill()
  }
})

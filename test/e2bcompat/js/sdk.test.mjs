// npm e2b, unchanged, against evalbox (E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set by test_js.py): a sandbox's lifecycle, commands and files.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

test('lifecycle, commands and files', async () => {
  const sb = await Sandbox.create('python', { timeoutMs: 120_000, metadata: { from: 'js' } })
  try {
    const out = []
    const r = await sb.commands.run('echo hi; echo err >&2', { onStdout: (d) => out.push(d) })
    assert.equal(r.stdout, 'hi\n')
    assert.equal(r.stderr, 'err\n')
    assert.equal(r.exitCode, 0)
    assert.equal(out.join(''), 'hi\n')
    await assert.rejects(sb.commands.run('echo partial; exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3 && e.stdout === 'partial\n')

    const h = await sb.commands.run('sleep 600', { background: true })
    assert.ok((await sb.commands.list()).some((p) => p.pid === h.pid))
    assert.ok(await h.kill())

    const cat = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(cat.pid, 'piped')
    await sb.commands.closeStdin(cat.pid)
    assert.equal((await cat.wait()).stdout, 'piped')

    await sb.files.write('/work/js/a.txt', 'from js')
    assert.equal(await sb.files.read('/work/js/a.txt'), 'from js')
    assert.deepEqual((await sb.files.list('/work/js')).map((e) => e.name), ['a.txt'])
    assert.ok(await sb.files.exists('/work/js/a.txt'))
    await sb.files.rename('/work/js/a.txt', '/work/js/b.txt')
    assert.equal((await sb.commands.run('cat /work/js/b.txt')).stdout, 'from js')
    await sb.files.remove('/work/js')
    assert.equal(await sb.files.exists('/work/js/b.txt'), false)

    const info = await Sandbox.getInfo(sb.sandboxId)
    assert.equal(info.sandboxId, sb.sandboxId)
    assert.deepEqual(info.metadata, { from: 'js' })
    const again = await Sandbox.connect(sb.sandboxId)
    assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
  } finally {
    assert.ok(await sb.kill())
  }
  await assert.rejects(Sandbox.getInfo(sb.sandboxId), NotFoundError)
  assert.equal(await Sandbox.kill(sb.sandboxId), false)
})

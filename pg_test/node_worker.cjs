// A worker's whole loop through node-postgres (npm `pg`), the way a Node
// worker is written: every call with `$n` parameters bound from JavaScript
// values, no casts. node-postgres sends parameters untyped, as pgx does, so
// each call also shows that its function can be resolved from its arguments
// alone. Receipts are kept as the text the server sent (a JavaScript `Date`
// keeps milliseconds, a receipt has microseconds). Run by test_node.py:
//
//   NODE_PATH=/opt/pg_sturdy/node/node_modules node pg_test/node_worker.cjs SOCKET_DIR PORT
//
// Prints an 'ok' or 'FAIL' line per test and a closing count; exits 1 on a failure.
'use strict';
const assert = require('node:assert/strict');
const { Client, types } = require('pg');

types.setTypeParser(1184, (v) => v); // timestamptz: the server's text, to the microsecond

const [host, port] = process.argv.slice(2);
const DB = 'sturdy_node';
const connect = async (database) => {
  const c = new Client({ host, port: Number(port), user: 'postgres', database });
  await c.connect();
  return c;
};

const tests = [];
const test = (name, body) => tests.push([name, body]);
const one = async (c, sql, params) => (await c.query(sql, params)).rows[0];

test('schedule, take with a claim, record and finish', async (c) => {
  await c.query('SELECT sturdy.schedule($1, $2, $3)', ['order-1', new Date(Date.now() - 1000), 'orders']);
  const job = await one(c, 'SELECT workflow, receipt, token FROM sturdy.take($1, $2, $3, $4)',
    ['orders', '1 minute', 1, true]);
  assert.equal(job.workflow, 'order-1');
  assert.equal(job.token, '1');
  const recorded = await one(c, 'SELECT * FROM sturdy.record($1, $2, $3, $4)',
    [job.workflow, 'charged', { id: 7 }, job.token]);
  assert.deepEqual(recorded, { recorded: { id: 7 }, first: true });
  const finished = await one(c, 'SELECT sturdy.finish($1, $2, $3, $4, $5, $6, $7) AS removed',
    [job.workflow, job.token, job.receipt, 'shipped', { at: 'dock 4' }, null, 'orders']);
  assert.equal(finished.removed, true);
  const steps = (await c.query('SELECT step FROM sturdy.load($1)', ['order-1'])).rows.map((r) => r.step);
  assert.deepEqual(steps, ['charged', 'shipped']);
});

test('a stale token is fenced with SD001', async (c) => {
  await c.query('SELECT sturdy.claim($1, $2)', ['order-2', '1 minute']);
  await c.query('SELECT sturdy.release($1, $2)', ['order-2', 1]);
  await c.query('SELECT sturdy.claim($1, $2, $3)', ['order-2', '1 minute', 'worker-b']);
  await assert.rejects(c.query('SELECT * FROM sturdy.record($1, $2, $3, $4)', ['order-2', 's', 1, 1]),
    (e) => e.code === 'SD001');
  const renewed = await one(c, 'SELECT sturdy.renew($1, $2, $3) IS NOT NULL AS renewed', ['order-2', 2, '5 minutes']);
  assert.equal(renewed.renewed, true);
  await c.query('SELECT sturdy.fence($1, $2)', ['order-2', 2]);
});

test('done, then done_many for a batch', async (c) => {
  for (let i = 0; i < 5; i++) {
    await c.query('SELECT sturdy.schedule($1, $2, $3)', [`mail-${i}`, new Date(Date.now() - 1000), 'mail']);
  }
  const first = await one(c, 'SELECT workflow, receipt FROM sturdy.take($1)', ['mail']);
  assert.equal((await one(c, 'SELECT sturdy.done($1, $2, $3) AS removed', [first.workflow, first.receipt, 'mail'])).removed, true);
  assert.equal((await one(c, 'SELECT sturdy.done($1, $2, $3) AS removed', [first.workflow, first.receipt, 'mail'])).removed, false);
  const rest = (await c.query('SELECT workflow, receipt FROM sturdy.take($1, $2, $3)', ['mail', '1 minute', 10])).rows;
  assert.equal(rest.length, 4);
  const removed = await one(c, 'SELECT sturdy.done_many($1, $2, $3) AS removed',
    [rest.map((r) => r.workflow), rest.map((r) => r.receipt), 'mail']);
  assert.equal(removed.removed, '4');
});

test('jobs with their input, enqueued in bulk: schedule_many, and take hands each input out', async (c) => {
  // each input as its JSON text: node-postgres writes a JavaScript array
  // inside an array parameter as a nested SQL array, not as JSON
  const inputs = [{ to: 'a@example.com' }, null, [1, 2]].map((v) => (v === null ? null : JSON.stringify(v)));
  const queued = await one(c, 'SELECT sturdy.schedule_many($1, $2, $3) AS n',
    [['job-1', 'job-2', 'job-3'], inputs, 'jobs']);
  assert.equal(queued.n, '3');
  const jobs = (await c.query('SELECT workflow, receipt, input FROM sturdy.take($1, $2, $3)', ['jobs', '1 minute', 10])).rows;
  assert.deepEqual(jobs.map((j) => [j.workflow, j.input]),
    [['job-1', { to: 'a@example.com' }], ['job-2', null], ['job-3', [1, 2]]]);
  const removed = await one(c, 'SELECT sturdy.done_many($1, $2, $3) AS removed',
    [jobs.map((j) => j.workflow), jobs.map((j) => j.receipt), 'jobs']);
  assert.equal(removed.removed, '3');
});

test('wake_at suspends, arrive wakes', async (c) => {
  await c.query('SELECT sturdy.schedule($1, $2, $3)', ['loan-1', new Date(Date.now() - 1000), 'loans']);
  const job = await one(c, 'SELECT workflow, receipt FROM sturdy.take($1)', ['loans']);
  const suspended = await one(c, 'SELECT sturdy.wake_at($1, $2, $3, $4) AS suspended',
    [job.workflow, job.receipt, new Date(Date.now() + 3600e3), 'loans']);
  assert.equal(suspended.suspended, true);
  assert.equal((await c.query('SELECT * FROM sturdy.take($1)', ['loans'])).rows.length, 0);
  const arrived = await one(c, 'SELECT sturdy.arrive($1, $2, $3, $4) AS value',
    ['loan-1', 'approval', { by: 'ana' }, 'loans']);
  assert.deepEqual(arrived.value, { by: 'ana' });
  assert.equal((await one(c, 'SELECT workflow FROM sturdy.take($1)', ['loans'])).workflow, 'loan-1');
});

test('emit and pump', async (c) => {
  await c.query('CREATE TABLE IF NOT EXISTS public.sent (payload jsonb)');
  await c.query(`CREATE OR REPLACE FUNCTION public.on_order(m sturdy.outbox, attempt integer) RETURNS void
                 LANGUAGE sql AS 'INSERT INTO public.sent VALUES (m.payload)'`);
  await c.query('SELECT sturdy.subscribe($1, $2)', ['order.placed', 'public.on_order(sturdy.outbox, integer)']);
  const emitted = await one(c, 'SELECT * FROM sturdy.emit($1, $2, $3)', ['order.placed', { order: 9 }, 'order-9']);
  assert.equal(emitted.deliveries, 1);
  const pumped = await one(c, 'SELECT * FROM sturdy.pump($1)', [10]);
  assert.equal(pumped.delivered, 1);
  assert.deepEqual((await one(c, 'SELECT payload FROM public.sent')).payload, { order: 9 });
  assert.equal((await one(c, 'SELECT sturdy.unsubscribe($1, $2) AS gone',
    ['order.placed', 'public.on_order(sturdy.outbox, integer)'])).gone, true);
});

test('start, status and transition', async (c) => {
  const id = (await one(c, 'SELECT sturdy.start($1, $2, $3, $4) AS id', ['ship', 'order-3', { order: 3 }, 'key-3'])).id;
  const again = (await one(c, 'SELECT sturdy.start($1, $2, $3, $4) AS id', ['ship', 'order-3', { order: 3 }, 'key-3'])).id;
  assert.equal(again, id);
  const moved = await one(c, 'SELECT sturdy.transition($1, $2, $3) AS moved', [id, 'pending', 'running']);
  assert.equal(moved.moved, true);
  const status = await one(c, 'SELECT status, revision FROM sturdy.status($1)', ['order-3']);
  assert.deepEqual(status, { status: 'running', revision: '2' });
  assert.equal((await c.query('SELECT * FROM sturdy.stuck($1)', ['1 hour'])).rows.length, 0);
});

test('a named batch job ticks to completion', async (c) => {
  await c.query('CREATE TABLE IF NOT EXISTS public.backlog (id bigserial PRIMARY KEY, moved boolean NOT NULL DEFAULT false)');
  await c.query('INSERT INTO public.backlog (moved) SELECT false FROM generate_series(1, 30)');
  await c.query('SELECT sturdy.batch_start($1, $2, $3, $4, $5, $6)',
    ['move', 'public.backlog', 'moved = $1', 'moved <> $1', [true], 20]);
  let tick;
  do {
    tick = await one(c, 'SELECT * FROM sturdy.batch_tick($1)', ['move']);
  } while (!tick.complete);
  assert.equal((await one(c, 'SELECT count(*) AS n FROM public.backlog WHERE moved')).n, '30');
  const chunk = await one(c, 'SELECT * FROM sturdy.batch($1, $2, $3, $4)', ['public.backlog', 'moved = $1', 'moved <> $1', [false]]);
  assert.equal(chunk.done, '30');
});

test('a failing pass: retry_queue, fail, the dead row redriven, then cancelled', async (c) => {
  await c.query('SELECT sturdy.retry_queue($1, $2)', ['flaky', 1]);
  await c.query('SELECT sturdy.schedule($1, $2, $3)', ['flaky-1', new Date(Date.now() - 1000), 'flaky']);
  const job = await one(c, 'SELECT workflow, receipt, attempt FROM sturdy.take($1)', ['flaky']);
  assert.equal(job.attempt, 1);
  const failed = await one(c, 'SELECT sturdy.fail($1, $2, $3, $4, $5, $6) AS failed',
    [job.workflow, job.receipt, 'TypeError: x is undefined', 'flaky', null, 'NJ001']);
  assert.equal(failed.failed, true);
  const dead = await one(c, 'SELECT visible_at = $1 AS dead, last_sqlstate FROM sturdy.queue WHERE workflow = $2',
    ['infinity', 'flaky-1']);
  assert.deepEqual(dead, { dead: true, last_sqlstate: 'NJ001' });
  // two untyped arguments: the queue's redrive, not the outbox's (one argument)
  assert.equal((await one(c, 'SELECT sturdy.redrive($1, $2) AS r', ['flaky-1', 'flaky'])).r, true);
  assert.equal((await one(c, 'SELECT sturdy.cancel($1, $2) AS c', ['flaky-1', 'flaky'])).c, true);
  assert.equal((await one(c, 'SELECT sturdy.cancel($1) AS c', ['nothing-here'])).c, false);
});

test('sweep', async (c) => {
  const kinds = (await c.query('SELECT kind FROM sturdy.sweep($1, $2)', ['1 second', 100])).rows.map((r) => r.kind);
  for (const kind of ['instances', 'lapsed', 'dead']) assert.ok(kinds.includes(kind), kinds.join(','));
});

(async () => {
  const admin = await connect('postgres');
  await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${DB}`);
  let passed = 0;
  let failed = 0;
  const c = await connect(DB);
  await c.query('CREATE EXTENSION pg_sturdy');
  for (const [name, body] of tests) {
    try {
      await body(c);
      console.log(`ok   ${name}`);
      passed++;
    } catch (e) {
      console.log(`FAIL ${name}: ${e.message.replace(/\n/g, ' ')}`);
      failed++;
    }
  }
  await c.end();
  await admin.query(`DROP DATABASE ${DB} WITH (FORCE)`);
  await admin.end();
  console.log(`node: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})().catch((e) => {
  console.log(`FAIL node_worker: ${e.message}`);
  process.exit(1);
});

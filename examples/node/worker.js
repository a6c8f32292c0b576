// A pg_sturdy worker in Node (npm `pg`). Takes each job with a claim, does
// its steps once each (a step recorded by an earlier pass is not done again),
// finishes it; sleeps on LISTEN when the queue is empty, or polls with
// backoff (--poll: behind PgBouncer in transaction mode, which cannot
// LISTEN). SIGTERM ends it cleanly: a job in hand is handed back at once.
//
//   node worker.js CONNECTION_STRING [QUEUE] [--poll] [--lease SECONDS]
'use strict';
const { Client, types } = require('pg');

// timestamptz as the server's text: a JavaScript Date keeps milliseconds, a
// receipt has microseconds, and done/finish must hand it back exactly
types.setTypeParser(types.builtins.TIMESTAMPTZ, (text) => text);

const STEPS = ['reserve', 'charge', 'ship'];
const argv = process.argv.slice(2);
const flag = (name) => argv.indexOf(name);
const poll = flag('--poll') >= 0;
const lease = flag('--lease') >= 0 ? `${argv[flag('--lease') + 1]} seconds` : '30 seconds';
const [url, queue = 'default'] = argv.filter((a, i) => !a.startsWith('--') && argv[i - 1] !== '--lease');

const doStep = (step, workflow, done) => ({ step, workflow, pid: process.pid, after: [...done].sort() });

async function runPass(db, { workflow, receipt, token }, stopping) {
  const done = new Set((await db.query('SELECT step FROM sturdy.load($1)', [workflow])).rows.map((r) => r.step));
  for (const step of STEPS) {
    if (stopping()) { // hand the job back now, not when its lease ends
      await db.query('SELECT sturdy.wake_at($1, $2, now(), $3)', [workflow, receipt, queue]);
      await db.query('SELECT sturdy.release($1, $2)', [workflow, token]);
      return;
    }
    if (!done.has(step)) {
      await db.query('SELECT recorded FROM sturdy.record($1, $2, $3, $4)',
        [workflow, step, doStep(step, workflow, done), token]);
      done.add(step);
    }
  }
  await db.query('SELECT sturdy.finish($1, $2, $3, queue => $4)', [workflow, token, receipt, queue]);
}

async function main() {
  // node-postgres binds parameters in an unnamed statement: fine behind a pooler
  const db = new Client({ connectionString: url });
  await db.connect();
  let stop = false;
  let wakeUp = () => {};
  for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => { stop = true; wakeUp(); });
  if (!poll) {
    db.on('notification', () => wakeUp());
    await db.query('LISTEN sturdy');
  }
  let backoff = 50;
  while (!stop) {
    const { rows: [job] } = await db.query(
      'SELECT workflow, receipt, token FROM sturdy.take($1, $2, claim => true, wake => $3)', [queue, lease, !poll]);
    if (!job) {
      // a poller backs off up to a second; a listener sleeps until a NOTIFY (or a second, for a missed one)
      await new Promise((resolve) => { wakeUp = resolve; setTimeout(resolve, poll ? backoff : 1000); });
      backoff = Math.min(backoff * 2, 1000);
      continue;
    }
    backoff = 50;
    if (job.token === null) continue; // another pass still holds the workflow: the row comes back later
    try {
      await runPass(db, job, () => stop);
    } catch (e) {
      if (e.code !== 'SD001') throw e; // fenced: a newer pass owns the workflow; drop this one
    }
  }
  await db.end();
}

main().catch((e) => { console.error(e); process.exit(1); });

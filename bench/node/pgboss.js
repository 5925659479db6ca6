// pg-boss, a peer of sqlmq's drain benchmark (bench/peers.py), in a database made for the
// round.
//
//   node pgboss.js preload N     start (which installs the schema), createQueue, then
//                                insert N no-op jobs in chunks
//   node pgboss.js work N        16 work() loops with batchSize 100 until N are completed
//
// pg-boss v10 has no concurrency option: each work() call is one loop that fetches a batch,
// runs the handler on it and completes the batch in one statement, then waits for the
// polling interval's remainder (its minimum, 0.5 s, here). Completed jobs stay in the job
// table (state 'completed') until maintenance archives them. Cron scheduling is off (the
// round has no schedules); the maintenance supervisor runs as by default.
"use strict";

const PgBoss = require("pg-boss");
const { DSN, PAYLOAD, CHUNK, emit, secondsSince, timedDrain, main } = require("./roles");

const QUEUE = "bench";
const LOOPS = 16;
const WORK = { batchSize: 100, pollingIntervalSeconds: 0.5 };
const REMAINING = "select count(*) as n from pgboss.job where state < 'completed'";

function boss(options = {}) {
  const b = new PgBoss({ connectionString: DSN, schedule: false, max: LOOPS + 4, ...options });
  b.on("error", (err) => console.error(err));
  return b;
}

async function preload(n) {
  n = Number(n);
  const b = boss({ supervise: false });
  await b.start();
  await b.createQueue(QUEUE);
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i += CHUNK) {
    const k = Math.min(CHUNK, n - i);
    await b.insert(Array.from({ length: k }, () => ({ name: QUEUE, data: PAYLOAD })));
  }
  const seconds = secondsSince(start);
  await b.getDb().executeSql("analyze pgboss.job");
  await b.stop({ graceful: false, wait: true });
  emit({ seconds });
}

async function work(n) {
  await timedDrain(Number(n), REMAINING, async (handled) => {
    const b = boss();
    await b.start();
    for (let i = 0; i < LOOPS; i += 1) {
      await b.work(QUEUE, WORK, async (jobs) => handled(jobs.length));
    }
    return () => b.stop({ graceful: false, wait: true });
  });
}

main({ preload, work });

// graphile-worker, a peer of sqlmq's drain benchmark (bench/peers.py), in one schema of a
// database made for the round.
//
//   node graphile.js preload N        migrate, then addJobs N no-op jobs in chunks
//   node graphile.js work N fast|default
//
// `fast` is the configuration of graphile-worker's performance page (a local queue of 500,
// job completions batched with a delay of 0); `default` leaves both off. Both run 16
// concurrent jobs with a pool of 17 connections. The clock stops when no job is left in
// the table (completed jobs are deleted), which the batched completion reaches after the
// last handler returned.
"use strict";

const { Logger, makeWorkerUtils, run } = require("graphile-worker");
const { DSN, PAYLOAD, CHUNK, emit, secondsSince, timedDrain, main } = require("./roles");

const CONCURRENCY = 16;
// A log line per job would cost the worker more than the job: nothing is logged.
const SILENT = new Logger(() => () => {});
const FAST = { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 };
const REMAINING = "select count(*) as n from graphile_worker._private_jobs";

async function preload(n) {
  n = Number(n);
  const utils = await makeWorkerUtils({ connectionString: DSN, logger: SILENT });
  await utils.migrate();
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i += CHUNK) {
    const k = Math.min(CHUNK, n - i);
    await utils.addJobs(Array.from({ length: k }, () => ({ identifier: "bench", payload: PAYLOAD })));
  }
  const seconds = secondsSince(start);
  await utils.withPgClient((c) => c.query("analyze graphile_worker._private_jobs"));
  await utils.release();
  emit({ seconds });
}

async function work(n, mode) {
  const preset = {
    worker: {
      connectionString: DSN,
      concurrentJobs: CONCURRENCY,
      maxPoolSize: CONCURRENCY + 1,
      ...(mode === "fast" ? FAST : {}),
    },
  };
  await timedDrain(Number(n), REMAINING, async (handled) => {
    const runner = await run({
      preset,
      noHandleSignals: true,
      logger: SILENT,
      taskList: { bench: async () => handled(1) },
    });
    return () => runner.stop();
  });
}

main({ preload, work });

// What the Node peers' scripts share: the DSN, the payload, the JSON lines the orchestrator
// (bench/peer_node.py) reads, and the wait for its word before a worker shuts down, so that
// the database's CPU is read while the worker's connections are still open.
"use strict";

const readline = require("readline");
const { Client } = require("pg");

const DSN = process.env.BENCH_PG_DSN || "postgresql://postgres@127.0.0.1:5432/test";
const PAYLOAD = { body: "x".repeat(64) };
const CHUNK = 5000;

function emit(fields) {
  process.stdout.write(JSON.stringify(fields) + "\n");
}

function nextLine() {
  return new Promise((resolve) => {
    const rl = readline.createInterface({ input: process.stdin });
    rl.once("line", () => { rl.close(); resolve(); });
    rl.once("close", resolve);
  });
}

/** Resolves once `query` (a count) returns 0, polled every 5 ms. */
async function untilZero(client, query) {
  for (;;) {
    const { rows } = await client.query(query);
    if (Number(rows[0].n) === 0) return;
    await new Promise((r) => setTimeout(r, 5));
  }
}

function secondsSince(start) {
  return Number(process.hrtime.bigint() - start) / 1e9;
}

/**
 * A worker's drain of `n` jobs, timed from `start(handled)` (which starts the worker, whose
 * handler calls `handled(k)` for every k jobs it ran, and resolves to its stop function)
 * until `remaining` (a count query) finds no job left undone in the database. Reports, then
 * waits for the orchestrator's line before stopping the worker.
 */
async function timedDrain(n, remaining, start) {
  const client = new Client({ connectionString: DSN });
  await client.connect();
  let count = 0;
  let allHandled;
  const handledAll = new Promise((r) => { allHandled = r; });
  const handled = (k) => {
    count += k;
    if (count >= n) allHandled();
  };
  const started = process.hrtime.bigint();
  const stop = await start(handled);
  await handledAll;
  await untilZero(client, remaining);
  emit({ seconds: secondsSince(started), handled: count });
  await nextLine();
  await stop();
  await client.end();
}

function main(roles) {
  const [role, ...args] = process.argv.slice(2);
  if (!roles[role]) {
    console.error(`unknown role ${role}`);
    process.exit(2);
  }
  roles[role](...args).then(
    () => process.exit(0),
    (err) => { console.error(err); process.exit(1); },
  );
}

module.exports = { DSN, PAYLOAD, CHUNK, emit, secondsSince, timedDrain, main };

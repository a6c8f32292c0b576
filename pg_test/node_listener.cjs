// A node-postgres client LISTENing in a SQL_ASCII database while a wakeup
// is sent for a queue whose name is not valid UTF-8: it must get the
// notification, its payload the queue's name escaped (pg_test/test_encoding_wakeups.py).
// Usage: node node_listener.cjs HOST PORT DATABASE
const { Client } = require("pg");

async function main() {
  const [host, port, database] = process.argv.slice(2);
  const listener = new Client({ host, port: Number(port), user: "postgres", database });
  const other = new Client({ host, port: Number(port), user: "postgres", database });
  let failed = null;
  listener.on("error", (e) => { failed = e; });
  await listener.connect();
  await other.connect();
  const got = [];
  listener.on("notification", (n) => got.push(n.payload));
  await listener.query("LISTEN sturdy");
  // an empty take marks the queue; a schedule there wakes it
  await listener.query("SELECT count(*) FROM sturdy.take(E'nq\\xff\\\\x')");
  await other.query("SELECT sturdy.schedule('w1', now(), E'nq\\xff\\\\x')");
  for (let i = 0; i < 50 && got.length === 0 && !failed; i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  // the connection still answers
  const { rows } = await listener.query("SELECT 1 AS one");
  await listener.end();
  await other.end();
  if (failed) throw failed;
  console.log(JSON.stringify({ got, one: rows[0].one }));
}

main().catch((e) => { console.error(e); process.exit(1); });

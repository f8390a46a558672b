// Starts the pinned Node reference server (@durable-streams/server) for
// ursula-bench. Usage:
//   node reference-server.mjs --port 4437 --data-dir DIR   # file-backed store
//   node reference-server.mjs --port 4437 --memory         # in-memory store
// Options: --host (default 127.0.0.1), --long-poll-timeout-ms (default 30000).
// Prints one "ready" line once listening; exits on SIGTERM/SIGINT.
import { DurableStreamTestServer } from "@durable-streams/server"

function parseArgs(argv) {
  const out = { host: "127.0.0.1", port: 4437, dataDir: undefined, memory: false, longPollTimeout: 30000 }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const next = () => {
      const v = argv[++i]
      if (v === undefined) throw new Error(`${a} needs a value`)
      return v
    }
    if (a === "--port") out.port = Number(next())
    else if (a === "--host") out.host = next()
    else if (a === "--data-dir") out.dataDir = next()
    else if (a === "--memory") out.memory = true
    else if (a === "--long-poll-timeout-ms") out.longPollTimeout = Number(next())
    else throw new Error(`unknown argument ${a}`)
  }
  if (!Number.isInteger(out.port) || out.port < 0 || out.port > 65535) throw new Error("bad --port")
  if (out.memory === Boolean(out.dataDir)) throw new Error("give exactly one of --memory or --data-dir DIR")
  return out
}

const args = parseArgs(process.argv.slice(2))
const server = new DurableStreamTestServer({
  host: args.host,
  port: args.port,
  dataDir: args.memory ? undefined : args.dataDir,
  longPollTimeout: args.longPollTimeout,
})
await server.start()
console.log(`ready ${args.memory ? "memory" : "file"} ${server.url} pid ${process.pid}`)

let stopping = false
async function shutdown() {
  if (stopping) return
  stopping = true
  // Never hang on shutdown: the bench kills rounds on a clock.
  setTimeout(() => process.exit(0), 2000).unref()
  try {
    await server.stop()
  } finally {
    process.exit(0)
  }
}
process.on("SIGTERM", shutdown)
process.on("SIGINT", shutdown)

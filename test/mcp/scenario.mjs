// The official TypeScript MCP SDK's client against `boxrt mcp`, over stdio
// (node spawns boxrt) or Streamable HTTP (MCP_URL, MCP_TOKEN). Run by
// test/mcp_test.go, which checks what it prints last: one JSON line.
//
//   node scenario.mjs stdio   (BOXRT_BIN, BOXRT_STATE_DIR; boxrt's
//                              environment is passed through)
//   node scenario.mjs http    (MCP_URL, MCP_TOKEN)
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const mode = process.argv[2];

function transport() {
	if (mode === "stdio") {
		return new StdioClientTransport({
			command: process.env.BOXRT_BIN,
			args: ["mcp", "--state-dir", process.env.BOXRT_STATE_DIR, "--log-level", "debug"],
			env: process.env,
			stderr: "inherit",
		});
	}
	return new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
		requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
	});
}

const text = (res) => res.content.filter((c) => c.type === "text").map((c) => c.text).join("");

const client = new Client({ name: "boxrt-test", version: "1.0.0" });
const conn = transport();
await client.connect(conn);

// The tools, each with a schema and a description.
const { tools } = await client.listTools();
const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
for (const name of ["run_command", "start_command", "read_command_output", "stop_command", "read_file", "write_file",
	"list_files", "stat_file", "remove_file", "create_session", "list_sessions", "delete_session", "suspend_session",
	"snapshot_session", "fork_session"]) {
	assert.ok(byName[name], `tool ${name} listed`);
	assert.ok(byName[name].description.length > 20, `${name} described`);
	assert.equal(byName[name].inputSchema.type, "object");
}
assert.deepEqual(byName.run_command.inputSchema.required, ["command"]);

// A command whose output streams as progress while it runs.
const progress = [];
const started = Date.now();
const run = await client.callTool(
	{ name: "run_command", arguments: { command: "echo one; sleep 1; echo two", timeout_sec: 30 } },
	undefined,
	{ onprogress: (p) => progress.push({ at: Date.now() - started, message: p.message, progress: p.progress }) },
);
const ranFor = Date.now() - started;
assert.equal(run.isError ?? false, false, text(run));
assert.equal(run.structuredContent.exit_code, 0);
assert.equal(run.structuredContent.stdout, "one\ntwo\n");
const session = run.structuredContent.session_id;
assert.match(session, /^mcp-[0-9a-f]{12}$/);
// The result has all of the output; the progress its start at least (the
// TypeScript SDK handles a notification a tick later than a response, so
// over stdio it drops one that arrives with the result).
const streamed = progress.map((p) => p.message).join("");
assert.ok(streamed.startsWith("one\n") && "one\ntwo\n".startsWith(streamed), `streamed ${JSON.stringify(streamed)}`);
assert.ok(progress[0].at < ranFor - 500, `the first output came while the command ran: ${JSON.stringify(progress)} result at ${ranFor}`);

// Write then read a file, as text and as bytes.
let res = await client.callTool({ name: "write_file", arguments: { path: "/workspace/dir/hello.txt", content: "héllo\n" } });
assert.equal(res.isError ?? false, false, text(res));
res = await client.callTool({ name: "read_file", arguments: { path: "/workspace/dir/hello.txt" } });
assert.equal(res.structuredContent.content, "héllo\n");
res = await client.callTool({ name: "write_file", arguments: { path: "/workspace/bin", content_base64: "/wAB" } });
assert.equal(res.isError ?? false, false, text(res));
res = await client.callTool({ name: "read_file", arguments: { path: "/workspace/bin" } });
assert.equal(res.structuredContent.content_base64, "/wAB");
res = await client.callTool({ name: "run_command", arguments: { command: "cat /workspace/dir/hello.txt" } });
assert.equal(res.structuredContent.stdout, "héllo\n");
res = await client.callTool({ name: "list_files", arguments: { path: "/workspace/dir" } });
assert.deepEqual(res.structuredContent.entries.map((e) => e.name), ["hello.txt"]);

// A large file (6 MiB of text, 8 MiB in base64 on the way to the
// catalogue) fits a message on both transports.
res = await client.callTool({ name: "write_file", arguments: { path: "/workspace/big.txt", content: "a".repeat(6 << 20) } });
assert.equal(res.isError ?? false, false, text(res));
assert.equal(res.structuredContent.bytes_written, 6 << 20);
res = await client.callTool({ name: "stat_file", arguments: { path: "/workspace/bin" } });
assert.equal(res.structuredContent.type, "file");
assert.equal(res.structuredContent.size, 3);
res = await client.callTool({ name: "remove_file", arguments: { path: "/workspace/bin" } });
assert.equal(res.isError ?? false, false, text(res));

// A background command: started, read while it runs, stopped.
res = await client.callTool({ name: "start_command", arguments: { command: "echo bg; sleep 30" } });
assert.equal(res.isError ?? false, false, text(res));
const execId = res.structuredContent.exec_id;
res = await client.callTool({ name: "read_command_output", arguments: { exec_id: execId, wait_sec: 1 } });
assert.equal(res.isError ?? false, false, text(res));
assert.equal(res.structuredContent.status, "running");
assert.equal(res.structuredContent.stdout, "bg\n");
res = await client.callTool({ name: "stop_command", arguments: { exec_id: execId } });
assert.equal(res.structuredContent.status, "canceled");
res = await client.callTool({ name: "read_command_output", arguments: { exec_id: execId } });
assert.equal(res.isError, true);
assert.equal(res.structuredContent.status, "canceled");

// A fork has the session's files; it can be snapshotted, suspended and
// deleted.
res = await client.callTool({ name: "fork_session", arguments: {} });
assert.equal(res.isError ?? false, false, text(res));
const fork = res.structuredContent.session_id;
res = await client.callTool({ name: "read_file", arguments: { path: "/workspace/dir/hello.txt", session: fork } });
assert.equal(res.structuredContent.content, "héllo\n");
res = await client.callTool({ name: "snapshot_session", arguments: { session: fork } });
assert.match(res.structuredContent.snapshot_id, /^snap-/, text(res));
res = await client.callTool({ name: "suspend_session", arguments: { session: fork } });
assert.equal(res.structuredContent.state, "suspended", text(res));
res = await client.callTool({ name: "list_sessions", arguments: {} });
assert.deepEqual(res.structuredContent.sessions.map((s) => s.session_id).sort(), [fork, session].sort());
res = await client.callTool({ name: "delete_session", arguments: { session: fork } });
assert.equal(res.structuredContent.deleted, fork);

// A command that fails is a tool error with its exit code and output.
res = await client.callTool({ name: "run_command", arguments: { command: "echo out; echo err >&2; exit 7" } });
assert.equal(res.isError, true);
assert.equal(res.structuredContent.exit_code, 7);
assert.match(text(res), /exit code 7/);
assert.match(text(res), /out\n/);
assert.match(text(res), /err\n/);

// boxrt's own failure: its error type and a hint.
res = await client.callTool({ name: "read_file", arguments: { path: "/workspace/missing" } });
assert.equal(res.isError, true);
assert.match(text(res), /^BoxFileNotFoundError: /);
assert.match(text(res), /Hint: /);
assert.equal(res.structuredContent.error.type, "BoxFileNotFoundError");

// Cancellation kills the command: the session's next command runs at once
// (commands of a session run one at a time).
const abort = new AbortController();
let cancelled;
const sleeping = client.callTool({ name: "run_command", arguments: { command: "echo started; sleep 60", timeout_sec: 120 } }, undefined, {
	signal: abort.signal,
	onprogress: () => abort.abort("test cancels"),
});
await sleeping.then(() => assert.fail("the cancelled call answered"), (e) => { cancelled = String(e); });
const after = Date.now();
res = await client.callTool({ name: "run_command", arguments: { command: "echo after" } });
assert.equal(res.structuredContent.stdout, "after\n");
assert.ok(Date.now() - after < 15000, "the next command waited for the cancelled one");

// Over HTTP, a persistent session outlives the connection (the test
// checks, then deletes it).
if (mode === "http") {
	res = await client.callTool({ name: "create_session", arguments: { session: "kept", persistent: true } });
	assert.equal(res.isError ?? false, false, text(res));
}

// Ending the connection: over HTTP the client ends its MCP session (DELETE).
if (mode === "http") {
	await conn.terminateSession();
}
await client.close();
console.log(JSON.stringify({ session, progress: progress.length, cancelled }));

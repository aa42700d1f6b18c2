// Package echopeer is the ping baseline's protocol: a JSON-RPC peer that
// decodes each request's id and answers {"jsonrpc":"2.0","id":ID,
// "result":{}} and nothing else. The harness runs it as its own echo peer
// and linkedecho runs the same loop inside a binary that links boxrt's
// packages, so both baselines answer with the very same code.
package echopeer

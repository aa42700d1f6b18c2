// Package echopeer is the ping baseline's protocol: a JSON-RPC peer that
// decodes each request's id and answers {"jsonrpc":"2.0","id":ID,
// "result":{}} and nothing else. The harness runs it as its own echo peer
// (a copy of its binary started with -echo-peer).
package echopeer

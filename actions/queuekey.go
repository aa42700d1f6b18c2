package actions

import (
	"encoding/json"
	"strings"

	"github.com/boxrt/boxrt/rpc"
)

// QueueKey is the fair-share key of a request (rpc.WithQueueKey): the
// session it names, within its Workspace, so that one session's burst
// waits its turn behind other sessions' calls. It reads the params' top
// level only, without decoding them (a file write's content is skipped,
// not parsed); params it cannot read have no key ("").
func QueueKey(req *rpc.Request) string {
	id := topLevelString(req.Params, sessionIDName)
	if id == "" {
		return ""
	}
	if req.Meta != nil {
		return req.Meta.InstanceUUID + "\x00" + req.Meta.WorkspaceUUID + "\x00" + id
	}
	return id
}

// topLevelString returns the string member name of the JSON object obj,
// "" when obj is not an object or has no such string member.
func topLevelString(obj []byte, name string) string {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return ""
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return ""
		}
		keyEnd := skipString(obj, i)
		if keyEnd < 0 {
			return ""
		}
		key := obj[i+1 : keyEnd-1]
		i = skipSpace(obj, keyEnd)
		if i >= len(obj) || obj[i] != ':' {
			return ""
		}
		i = skipSpace(obj, i+1)
		end := skipValue(obj, i)
		if end < 0 {
			return ""
		}
		if string(key) == name {
			var s string
			if json.Unmarshal(obj[i:end], &s) != nil {
				return ""
			}
			return s
		}
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ',' {
			return ""
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"'),
// or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1;
// it checks only what it must to find the end.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				end := skipString(b, i)
				if end < 0 {
					return -1
				}
				i = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	end := i
	for end < len(b) && strings.IndexByte(",}] \t\n\r", b[end]) < 0 {
		end++
	}
	if end == i {
		return -1
	}
	return end
}

package mcpserver

import (
	"testing"

	"go.uber.org/goleak"
)

// Every connection's goroutine (and the SDK's) ends with the connection.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAgentUsage: the agent without its socket, or with arguments, is a
// usage error; its runs are tested in package sandboxagent/agenttest.
func TestAgentUsage(t *testing.T) {
	assert.Equal(t, 2, Main("", []string{"boxrt", "agent"}))
	assert.Equal(t, 2, Main("", []string{"boxrt", "agent", "--connect", "/x", "extra"}))
	assert.Equal(t, 2, Main("", []string{"boxrt", "agent", "--bogus"}))
}

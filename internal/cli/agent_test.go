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
	assert.Equal(t, 2, Main("", []string{"boxrt", "agent", "--connect", "/x", "--listen", "/y"}))
	assert.Equal(t, 2, Main("", []string{"boxrt", "agent", "--version", "--bridge", "/y"}))
	// The probe a Pod's upload runs.
	assert.Equal(t, 0, Main("", []string{"boxrt", "agent", "--version"}))
}

package kube

import "time"

// WaitAgent waits for the end of pod's agent warm-up, so that a test's
// commands go through the agent.
func (b *Backend) WaitAgent(pod string) {
	for b.warming(pod) {
		time.Sleep(20 * time.Millisecond)
	}
}

package docker

import "github.com/boxrt/boxrt/backends/internal/sandboxsh"

// The shell snippets are shared with the kube backend (see sandboxsh).
const (
	execScript        = sandboxsh.ExecScript
	interactiveScript = sandboxsh.InteractiveScript
	procScript        = sandboxsh.ProcScript
	signalScript      = sandboxsh.SignalScript
	orphanScript      = sandboxsh.OrphanScript
	keepAlive         = sandboxsh.KeepAlive
)

var (
	signalNames    = sandboxsh.SignalNames
	signalExitCode = sandboxsh.SignalExitCode
	ttySizeCommand = sandboxsh.TTYSizeCommand
	shellFlags     = sandboxsh.ShellFlags
)

package agentboot

import (
	"os"
	"runtime"
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		runtime.GOMAXPROCS(1)
	}
}

// Command linkedecho is the ping scenario's linked echo peer: the echo
// peer's loop (echopeer.ServeLines) in a binary that links the packages
// boxrt's main imports, so it carries boxrt's dependencies, their package
// initialisation and a binary of boxrt's size, while none of boxrt's own
// code runs. Against the plain echo peer it shows what being the boxrt
// binary costs one caller, with the per-call code held equal.
package main

import (
	"fmt"
	"os"
	_ "os/signal"

	_ "github.com/docker/docker/client"
	_ "github.com/go-logr/logr/funcr"
	_ "github.com/prometheus/client_golang/prometheus/collectors"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/rs/zerolog"
	_ "github.com/urfave/cli/v2"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/klog/v2"

	_ "github.com/boxrt/boxrt/actions"
	_ "github.com/boxrt/boxrt/backends"
	_ "github.com/boxrt/boxrt/backends/bwrap"
	_ "github.com/boxrt/boxrt/backends/docker"
	_ "github.com/boxrt/boxrt/backends/host"
	_ "github.com/boxrt/boxrt/backends/kube"
	_ "github.com/boxrt/boxrt/internal/atomicfile"
	_ "github.com/boxrt/boxrt/internal/backendfactory"
	_ "github.com/boxrt/boxrt/internal/cli"
	_ "github.com/boxrt/boxrt/internal/controltoken"
	_ "github.com/boxrt/boxrt/internal/fdsafe"
	_ "github.com/boxrt/boxrt/internal/logsink"
	_ "github.com/boxrt/boxrt/internal/server"
	_ "github.com/boxrt/boxrt/internal/statelock"
	_ "github.com/boxrt/boxrt/reconnect"
	_ "github.com/boxrt/boxrt/relay"
	_ "github.com/boxrt/boxrt/rpc"
	_ "github.com/boxrt/boxrt/runtime"
	_ "github.com/boxrt/boxrt/runtime/skills"
	"github.com/boxrt/boxrt/test/bench/echopeer"
)

func main() {
	if err := echopeer.ServeLines(os.Stdin, os.Stdout, 0); err != nil {
		fmt.Fprintln(os.Stderr, "linked echo peer:", err)
		os.Exit(1)
	}
}

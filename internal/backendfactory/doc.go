// Package backendfactory is the only place that knows the concrete
// backends (bwrap, docker, kube, host, e2b): it maps a backend name and the
// configuration onto one of them. The server hands New to the runtime as
// its factory; the doctor uses it to probe each backend. Adding a backend
// is a case here.
package backendfactory

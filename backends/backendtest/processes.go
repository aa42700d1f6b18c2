package backendtest

// ListProcesses is a command for a container backend's exec that prints the
// command line of every process in the sandbox but the listing's own: those
// whose session is the listing shell's. A plain exec's wrapper execs the
// command in place, so the shell's $$ is the exec's session id; that also
// skips its watcher, whose argv carries this very script (matching on the
// text fails where `ps` truncates argv, as busybox's does). An exec
// prestarted for the next command (see ListPrestarted) is boxrt's, not a
// command's, and is skipped too.
const ListProcesses = `for d in /proc/[0-9]*; do
	read -r st <"$d/stat" || continue
	set -- ${st##*) }
	[ "$4" = "$$" ] && continue
	c=$(tr '\0' ' ' <"$d/cmdline")
	case $c in *' boxrt-exec ') continue ;; esac
	printf '%s\n' "$c"
done`

// ListPrestarted is a command for a container backend's exec that prints
// the pid of every process waiting as a prestarted exec
// (sandboxsh.PrestartScript): its argv ends with the script's $0, where an
// exec's wrapper has its arguments after it.
const ListPrestarted = `for d in /proc/[0-9]*; do
	[ "$(tr '\0' '\n' <"$d/cmdline" | tail -n 1)" = boxrt-exec ] && echo "${d#/proc/}"
done; true`

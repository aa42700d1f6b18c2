package sandboxsh

import (
	"strconv"
	"strings"
	"syscall"
)

// Shell snippets run inside the sandbox by the container backends (docker,
// kube). They are passed as the script of
// `sh -c` with user data only ever in positional parameters, so no caller
// string is ever spliced into shell source.
//
// Every process started by an exec is a session leader: runc calls setsid for
// each exec. The command's whole tree therefore shares that session id unless
// something calls setsid again, and that survives re-parenting to the
// container's init, which a plain parent/child walk would miss (a fork bomb
// orphans almost all of its processes). The scan below takes every process
// whose session is the root's, plus anything whose parent is already taken.
// It uses /proc/<pid>/stat rather than /proc/<pid>/task/*/children because
// the latter needs CONFIG_PROC_CHILDREN, which some kernels (Firecracker
// guests among them) lack.
//
// Only builtins are used (read, kill, [, case, arithmetic), so the killer
// never forks: a fork bomb that has used up the pids limit cannot stop it.
//
// A scan alone cannot stop a tree that forks faster than a pass reads /proc
// (a fork bomb: passes have been seen to find 11 of its 52 processes and end
// with it still running). But a non-interactive shell puts every process it
// starts in its own process group, which is the root's (the session leader
// leads a group of the same id), and kill(2) on a group reaches every member
// at once, forks in flight included. So a SIGKILL first stops the root's
// group with one call, then stops, pass by pass, the members that left the
// group (setsid, an interactive shell's jobs), until a full pass finds
// nobody running: stopped processes cannot fork, so the set stops growing
// and nobody is re-parented away mid-kill. Then the group and every member
// get SIGKILL, and the passes go on until the members' zombies are reaped
// too, since a zombie still holds its pid and a pids-limited session could
// not start its next command.
//
// bk_kill SIG ROOT SPARE [ingroup]: signal the session ROOT with SIG, never
// touching the pid SPARE (the caller itself). A caller inside the root's
// group ("ingroup": ExecScript's watcher) cannot stop the group without
// stopping itself; it kills, one by one, only the members outside the group
// and leaves the group to its caller's final group kill.
const KillFuncs = `
bk_one() {
	# For an ingroup caller a group member is left to the group kill (and
	# a churning group must not keep the passes going); it still joins
	# the set, so that its children outside the group are found.
	bk_left=
	[ -n "$bk_in" ] && [ "$4" = "$bk_root" ] && bk_left=1
	case $bk_set in
	*" $bk_p "*) ;;
	*)
		if [ "$5" != "$bk_root" ]; then
			case $bk_set in *" $3 "*) ;; *) return ;; esac
		fi
		bk_set="$bk_set$bk_p "
		[ -n "$bk_left" ] || bk_more=0
		;;
	esac
	[ -n "$bk_left" ] && return
	case $2 in
	Z | X | x)
		[ "$1" = KILL ] && bk_more=0
		return
		;;
	esac
	case $1 in
	collect) ;;
	STOP) [ "$2" = T ] || { kill -s STOP "$bk_p"; bk_more=0; } ;;
	*) kill -s "$1" "$bk_p"; bk_more=0 ;;
	esac
}
bk_pass() {
	bk_more=1
	for bk_d in /proc/[0-9]*; do
		bk_p=${bk_d#/proc/}
		[ "$bk_p" = "$bk_spare" ] && continue
		bk_st=
		read -r bk_st <"$bk_d/stat" || continue
		bk_one "$1" ${bk_st##*) }
	done
	return $bk_more
}
bk_group() {
	[ -n "$bk_in" ] || kill -s "$1" -- "-$bk_root"
}
bk_kill() {
	bk_root=$2 bk_spare=$3 bk_in=$4 bk_set=' ' bk_i=0
	if [ "$1" = KILL ]; then
		bk_group STOP
		while [ $bk_i -lt 500 ] && bk_pass STOP; do bk_i=$((bk_i + 1)); done
		bk_group KILL
		bk_i=0
		while [ $bk_i -lt 2000 ] && bk_pass KILL; do bk_i=$((bk_i + 1)); done
	else
		while [ $bk_i -lt 10 ] && bk_pass collect; do bk_i=$((bk_i + 1)); done
		for bk_p in $bk_set; do kill -s "$1" "$bk_p"; done
	fi
}
`

// ExecScript wraps a box_exec command. $1 workdir, $2 command, $3 pid file,
// $4 "live" for an exec that may be signalled (see below), $5 the shell's
// flags (ShellFlags; the login shell's when empty).
//
// The kill path must not need a new process at kill time (the pids limit may
// be exhausted, and `docker exec` itself needs a pid), so a watcher subshell
// is forked up front. It blocks reading the exec's stdin, which only boxrt
// writes to: a line is a kill request; EOF comes when boxrt closes the
// exec's connection, after the command ended or because boxrt went away,
// and the watcher kills unless the command's process has ended. A kill
// takes the whole session of the wrapper except the watcher itself. The
// command's own stdin is /dev/null, as with a non-interactive docker exec.
// The pid file is only for the fallback path (a second exec) if the watcher
// is gone. The watcher is in the wrapper's process group, so it kills the
// members outside the group one by one and ends with one kill of the whole
// group, itself included (see KillFuncs). It never forks before that kill
// (in dash a failed fork ends the shell, and under a fork bomb that would
// be before the kill): the pid file is deleted by the watcher only when
// there was nothing to kill, otherwise by boxrt's follow-up SignalScript,
// which also waits for the killed processes' zombies to be reaped (each
// still holds a pid). The watcher ignores signals: those a command sends to
// its own group (kill 0) must not leave its pid file behind.
//
// A plain exec runs its command in place (exec sh -lc): the exec ends, and
// its exit status is taken, the moment the command's process does, and
// what used to follow the command on the answer's path (ending the
// watcher, deleting the pid file) is the watcher's work at EOF. So that
// the command never has the watcher as a child (a program that waits for
// all its children would wait for it), the watcher is forked from a
// subshell that exits at once; it stays in the group. What the command
// started in the background keeps running (the reference's behaviour).
//
// A live exec may get signals (box_exec_kill with TERM, …), which go to the
// whole session. There the wrapper stays between the exec and the command:
// it catches them with a trap that only notes them (its child's
// dispositions start at the defaults again), so it keeps waiting for the
// command and the exec ends, with the command's own status, when the
// command does: a command that handles TERM gets to finish, and the exec is
// not cut off when a shell running a compound command dies of the signal
// (at once on Podman, 2 s later on dockerd). A signalled exec was being
// killed, however gently: the wrapper then keeps its pid file, and at EOF
// the watcher kills what the command left behind (a child that ignored the
// signal), as it does on every backend. A command that ended on its own
// has its pid file removed by the wrapper, and what it left running (a
// background server) stays, as a plain exec's does: a session is a
// machine.
const ExecScript = KillFuncs + `
bk_ended() {
	bk_st=
	read -r bk_st <"/proc/$1/stat"
	case ${bk_st##*) } in '' | Z* | X* | x*) return 0 ;; esac
	return 1
}
{ echo $$ >"$3"; } 2>/dev/null
exec 3<&0 </dev/null
( (
	trap '' TERM INT HUP QUIT USR1 USR2
	read -r bk_self _ </proc/self/stat
	if read -r _ <&3 || ! bk_ended $$ || { [ "$4" = live ] && [ -e "$3" ]; }; then
		bk_kill KILL $$ "$bk_self" ingroup
		kill -s KILL -- "-$$"
	fi
	exec rm -f "$3"
) >/dev/null 2>&1 & )
exec 3<&-
{ [ -d "$1" ] || mkdir -p "$1"; } && cd "$1" || exit
[ "$4" = live ] || exec sh "${5:--lc}" "$2"
` + keepOnSignal

// PrestartHead starts the script of an exec started before its command is
// known: it waits for one line on its stdin, written by PrestartLine, which
// sets the positional parameters. Starting an exec is most of an exec's
// cost (a runc exec or a bwrap spawn is a new process joining or making
// namespaces and cgroups), so a sandbox kept warm for a session's first
// command keeps one waiting: that command then costs a write and a shell.
// Its stdin is a pipe, which the shell reads a byte at a time, so nothing
// after the line is consumed. EOF before a line (boxrt closing an unused
// one, or gone) ends it.
const PrestartHead = `bk_nl='
'
IFS= read -r bk_l || exit 0
eval "$bk_l"
`

// PrestartScript is a container backend's prestarted plain exec:
// PrestartHead, then ExecScript (the rest of the stdin stream is the
// watcher's).
const PrestartScript = PrestartHead + ExecScript

// prestartLineMax bounds a PrestartLine: the shell reads it a byte per
// system call, so a long command is cheaper as an exec argument.
const prestartLineMax = 16 << 10

// PrestartLine is the line that hands args to PrestartHead: a `set --`
// of every argument single-quoted, each newline written as "$bk_nl" so the
// whole is one line, and nothing in an argument is ever parsed as shell.
// ok is false for arguments a line cannot carry (a NUL byte, which the
// shell drops) or should not (longer than prestartLineMax).
func PrestartLine(args ...string) (line []byte, ok bool) {
	var b strings.Builder
	b.WriteString("set --")
	for _, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, false
		}
		b.WriteString(" '")
		a = strings.ReplaceAll(a, "'", `'\''`)
		b.WriteString(strings.ReplaceAll(a, "\n", `'"$bk_nl"'`))
		b.WriteByte('\'')
	}
	if b.Len() >= prestartLineMax {
		return nil, false
	}
	b.WriteByte('\n')
	return []byte(b.String()), true
}

// InteractiveScript wraps an exec whose stdin is the command's (written to
// by the host, or a terminal). $1 workdir, $2 command, $3 pid file, $4
// "tty" with a terminal, $5 the shell's flags as ExecScript's. There
// is no watcher (it would need the stdin): a kill goes through a helper
// exec and the pid file, as SignalScript does, and so does the sweep of
// what a signalled command left behind when it ends, which also deletes
// the pid file. The wrapper stays the session root so that every process
// of the command shares its session (the kernel does not reuse a pid that
// is still a session's id, so the sweep cannot hit a stranger). Like a
// live exec's (see ExecScript), the wrapper survives the signals it is
// sent, ends with the command's own status and, when it was not
// signalled, removes its pid file: what the command left running stays.
//
// With a terminal ($4 = tty) the wrapper first waits (briefly, and only if
// the image has stty) for the engine to size it: engines before API 1.42
// ignore the size given at creation and boxrt resizes right after the
// start, a moment after the command would otherwise have read 0x0.
const InteractiveScript = `
{ echo $$ >"$3"; } 2>/dev/null
if [ "$4" = tty ] && command -v stty >/dev/null 2>&1; then
	bk_i=0
	while [ $bk_i -lt 2000 ]; do
		case $(stty size 2>/dev/null) in '' | '0 '* | *' 0') ;; *) break ;; esac
		bk_i=$((bk_i + 1))
	done
fi
{ [ -d "$1" ] || mkdir -p "$1"; } && cd "$1" || { bk_c=$?; rm -f "$3"; exit $bk_c; }
` + keepOnSignal

// keepOnSignal ends a wrapper that stays the command's parent (a live
// ExecScript, InteractiveScript): it runs the command ($2, with the
// shell's flags $5) through the signals the session is sent, noting them,
// and exits with the command's status. The pid file ($3) goes unless a
// signal came: then the exec was being killed, and whoever sweeps after it
// (the watcher, or boxrt's SignalScript) finds it.
const keepOnSignal = `bk_sig=
trap 'bk_sig=1' TERM INT HUP QUIT USR1 USR2
sh "${5:--lc}" "$2"
bk_c=$?
[ -n "$bk_sig" ] || rm -f "$3" 2>/dev/null
exit $bk_c
`

// ProcScript starts a managed process. $1 cwd, $2 pid file, then the argv.
// exec keeps the process's pid equal to the recorded session root and makes
// the exec's exit code the process's own.
const ProcScript = `
{ echo $$ >"$2"; } 2>/dev/null
mkdir -p "$1" && cd "$1" || exit
shift 2
exec "$@"
`

// SignalScript signals the session recorded in a pid file. $1 pid file,
// $2 signal name, $3 "cleanup" to delete the pid file afterwards. A missing
// pid file means there is nothing left to signal.
const SignalScript = KillFuncs + `
exec 2>/dev/null
bk_r=
read -r bk_r <"$1"
case $bk_r in '' | *[!0-9]*) exit 0 ;; esac
bk_kill "$2" "$bk_r" $$
[ "$3" = cleanup ] && rm -f "$1"
exit 0
`

// OrphanScript kills, in a container being re-adopted, every process tree
// a previous boxrt started and can no longer reach: managed processes (and
// any exec whose watcher did not fire) recorded in pid files in the
// directories given as arguments. The new boxrt knows nothing of them, so
// nobody would ever stop them.
const OrphanScript = KillFuncs + `
exec 2>/dev/null
for bk_d; do
	for bk_f in "$bk_d"/.boxrt-proc-*.pid "$bk_d"/.boxrt-exec-*.pid; do
		[ -f "$bk_f" ] || continue
		bk_r=
		read -r bk_r <"$bk_f"
		case $bk_r in '' | *[!0-9]*) ;; *) bk_kill KILL "$bk_r" $$ ;; esac
		rm -f "$bk_f"
	done
done
exit 0
`

// agentExec is the command a session agent starts for box_exec: it makes
// and enters the workdir, then becomes the command's shell ($1 workdir,
// $2 the shell's flags: ShellFlags, $3 command), so that the process the
// agent started stays the command's: its exit status is the command's and
// its process group (the agent makes it a session leader) is the
// command's tree.
const agentExec = `{ [ -d "$1" ] || mkdir -p "$1"; } && cd "$1" || exit
exec sh "$2" "$3"`

// AgentExecArgv is the argv of agentExec running cmd in workdir. The
// command is the last argument: the agent's spawn frame carries a long
// last argument apart (sandboxagent), so a command may be as long as the
// kernel allows one argument to be.
func AgentExecArgv(workdir, cmd string, noLogin bool) []string {
	return []string{"sh", "-c", agentExec, "boxrt-exec", workdir, ShellFlags(noLogin), cmd}
}

// ShellFlags are the flags of the sh that runs a command: a login shell
// (-lc) unless the command is its own (backends.ExecRequest.NoLogin).
func ShellFlags(noLogin bool) string {
	if noLogin {
		return "-c"
	}
	return "-lc"
}

// KeepAlive is the container's main process. docker-init (Init: true) is
// pid 1 and reaps orphans; the loop only has to exist, and to exit promptly
// on SIGTERM so a plain stop does not wait for the kill timeout.
const KeepAlive = `trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done`

// SignalNames maps signals to the names `kill -s` takes. Names rather than
// numbers because the shell's numbering is the kernel's but POSIX only
// guarantees names.
var SignalNames = map[syscall.Signal]string{
	syscall.SIGHUP:   "HUP",
	syscall.SIGINT:   "INT",
	syscall.SIGQUIT:  "QUIT",
	syscall.SIGABRT:  "ABRT",
	syscall.SIGKILL:  "KILL",
	syscall.SIGUSR1:  "USR1",
	syscall.SIGUSR2:  "USR2",
	syscall.SIGPIPE:  "PIPE",
	syscall.SIGALRM:  "ALRM",
	syscall.SIGTERM:  "TERM",
	syscall.SIGCONT:  "CONT",
	syscall.SIGSTOP:  "STOP",
	syscall.SIGTSTP:  "TSTP",
	syscall.SIGWINCH: "WINCH",
}

// SignalExitCode turns the shell's 128+n exit code of a process killed by
// signal n back into -n, as the reference (and os/exec) report it. A
// process that really exits with such a code is indistinguishable and reads
// as killed.
func SignalExitCode(code int) int {
	if code > 128 && code <= 128+64 {
		return -(code - 128)
	}
	return code
}

// TTYSizeCommand is the argv of a helper exec that waits until the terminal
// of the exec recorded in pidFile has the given size. A backend needs it
// when a resize is not in effect by the time the engine answers: kube's
// travels apart from the keystrokes after it, and Podman applies an exec
// resize after answering the call.
func TTYSizeCommand(pidFile string, rows, cols uint16) []string {
	return []string{"sh", "-c", ttySizeScript, "boxrt-tty-size", pidFile,
		strconv.Itoa(int(rows)), strconv.Itoa(int(cols))}
}

// ttySizeScript waits until the terminal of the exec recorded in a pid file
// ($1) has $2 rows and $3 columns. It cannot tell, and so does not wait,
// when the image has no stty, the pid file is gone (the command ended) or
// the terminal cannot be opened; it fails when the size never arrives.
const ttySizeScript = `
exec 2>/dev/null
command -v stty >/dev/null || exit 0
bk_r=
read -r bk_r <"$1"
case $bk_r in '' | *[!0-9]*) exit 0 ;; esac
bk_i=0
while [ $bk_i -lt 500 ]; do
	bk_s=$(stty -F "/proc/$bk_r/fd/0" size) || exit 0
	[ "$bk_s" = "$2 $3" ] && exit 0
	bk_i=$((bk_i + 1))
done
echo "terminal size is $bk_s, not $2 $3"
exit 1
`

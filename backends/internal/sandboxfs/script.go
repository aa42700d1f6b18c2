package sandboxfs

import (
	"fmt"
	"strings"

	"github.com/boxrt/boxrt/backends"
)

// Script is run as: sh -c Script boxrt-fs OP MODE:MOUNT… -- ARGS…,
// every argument as printf octal escapes (shellArg): the Engine API carries
// exec arguments in JSON and the Pod exec subresource in a URL query, which
// would turn a file name's non-UTF-8 bytes into U+FFFD.
// Failures print "<param>|<kind>: <detail>" on stderr and exit 3, param
// naming the argument at fault (path, from, to). upload prints one line
// (the temporary file; an empty one when appending) once its checks have
// passed, before it reads stdin: the caller sends the data only then.
const Script = `
set -f
nl='
'
dec() { d=$(printf "$1"; echo x); d=${d%x}; }
dec "$1"; op=$d; shift
mounts=
while dec "$1" && [ "$d" != -- ]; do mounts="$mounts$nl$d"; shift; done
shift
n=$#
while [ $n -gt 0 ]; do dec "$1"; shift; set -- "$@" "$d"; n=$((n - 1)); done
F=path
die() { printf '%s|%s: %s\n' "$F" "$1" "$2" >&2; exit 3; }
resolve() {
	p=$1 tail=
	if [ "$2" = nofollow ] && [ "$p" != / ]; then
		tail=/${p##*/}; p=${p%/*}; [ -n "$p" ] || p=/
	fi
	while [ ! -e "$p" ] && [ ! -L "$p" ]; do
		tail=/${p##*/}$tail; p=${p%/*}; [ -n "$p" ] || p=/
	done
	r=$(readlink -f "$p" && echo x) || die unresolvable "$1"
	r=${r%"${nl}x"}
	[ "$r" = / ] && r=
	R=$r$tail
	[ -n "$R" ] || R=/
	M= MODE=
	IFS=$nl
	for m in $mounts; do
		mp=${m#*:}
		case $R in "$mp" | "$mp"/*) if [ ${#mp} -ge ${#M} ]; then M=$mp MODE=${m%%:*}; fi ;; esac
	done
	unset IFS
	[ -n "$M" ] || die outside "$R"
}
rw() { [ "$MODE" = rw ] || die readonly "$1"; }
busy() {
	IFS=$nl
	for m in $mounts; do
		case ${m#*:} in "$R" | "$R"/*) unset IFS; die mountpoint "$1" ;; esac
	done
	unset IFS
}
exists() { [ -e "$R" ] || [ -L "$R" ] || die notfound "$1"; }
case $op in
stat)
	resolve "$1" nofollow; exists "$1"
	stat -c '%f %s %Y' "$R" ;;
list)
	resolve "$1" follow; exists "$1"
	[ -d "$R" ] || die notdir "$1"
	printf '%s\n' "$R"
	find "$R" -mindepth 1 -maxdepth "$2" -exec stat -c '%f %s %Y' {} \; -print0 ;;
read)
	resolve "$1" follow; exists "$1"
	[ -f "$R" ] || die notfile "$1"
	stat -c '%f %s %Y' "$R" || die failed "stat $1"
	if [ "$2" = 0 ] && [ "$3" -lt 0 ]; then cat "$R"
	elif [ "$3" -lt 0 ]; then tail -c "+$(($2 + 1))" "$R"
	else tail -c "+$(($2 + 1))" "$R" | head -c "$3"; fi ;;
upload)
	resolve "$1" follow; rw "$1"
	[ -d "$R" ] && die isdir "$1"
	dir=${R%/*}; [ -n "$dir" ] || dir=/
	mkdir -p "$dir" || die failed "cannot create $dir"
	if [ "$3" = append ]; then
		new=; [ -e "$R" ] || new=1
		echo
		cat >>"$R" || die failed "append to $1"
		if [ -n "$2" ]; then chmod "$2" "$R"; elif [ -n "$new" ]; then chmod 644 "$R"; fi
		exit
	fi
	tmp=$(mktemp "$dir/.boxrt-upload-XXXXXX") || die failed "cannot create a temporary file in $dir"
	printf '%s\n' "$tmp"
	cat >"$tmp" || { rm -f "$tmp"; die failed "write $1"; } ;;
commit)
	case ${3##*/} in .boxrt-upload-*) ;; *) die failed "not an upload: $3" ;; esac
	resolve "$1" follow; rw "$1"
	[ -d "$R" ] && { rm -f "$3"; die isdir "$1"; }
	mode=$2
	# An existing file's mode is kept without its setuid, setgid and
	# sticky bits (its last three octal digits), as bwrap's file API does.
	if [ -z "$mode" ]; then mode=644; [ -f "$R" ] && mode=$(stat -c %a "$R") && mode=${mode#"${mode%???}"}; fi
	chmod "$mode" "$3" && mv -f "$3" "$R" || { rm -f "$3"; die failed "rename into $1"; } ;;
abort)
	case ${1##*/} in .boxrt-upload-*) rm -f "$1" ;; esac ;;
remove)
	resolve "$1" nofollow; rw "$1"; busy "$1"; exists "$1"
	if [ "$2" = recursive ]; then rm -rf "$R" || die failed "remove $1"
	elif [ -d "$R" ] && [ ! -L "$R" ]; then rmdir "$R" 2>/dev/null || die notempty "$1"
	else rm -f "$R" || die failed "remove $1"; fi ;;
mkdir)
	resolve "$1" follow
	[ -d "$R" ] && exit
	[ -e "$R" ] || [ -L "$R" ] && die exists "$1"
	rw "$1"
	mkdir -p "$R" || die failed "mkdir $1" ;;
rename)
	F=to
	resolve "$2" nofollow; rw "$2"; busy "$2"; T=$R TM=$M
	[ -d "$T" ] && [ ! -L "$T" ] && die isdir "$2"
	F=from
	resolve "$1" nofollow; rw "$1"; busy "$1"; exists "$1"
	F=to
	[ "$M" = "$TM" ] || die xdev "$2"
	mv -f "$R" "$T" || die failed "rename $1" ;;
esac
`

// mounts are the mount arguments of Script: MODE:PATH of the
// session's mounts and the tmpfs /tmp.
func mounts(info backends.Session) []string {
	out := []string{"rw:/tmp"}
	for _, m := range backends.FileMounts(info) {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		out = append(out, mode+":"+m.Path)
	}
	return out
}

// shellArg encodes s as printf octal escapes, one per byte: plain ASCII
// on the wire, no byte printf would read as a format.
func shellArg(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "\\%03o", s[i])
	}
	return b.String()
}

// Command is the argv of Script op with args on the session's mounts.
func Command(info backends.Session, op string, args ...string) []string {
	cmd := []string{"sh", "-c", Script, "boxrt-fs"}
	for _, a := range append(append(append([]string{op}, mounts(info)...), "--"), args...) {
		cmd = append(cmd, shellArg(a))
	}
	return cmd
}

package docker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

// The file API (runtime.FileSystem) runs inside the container, as the
// session's user, through one exec of fsScript per call (two for a
// replacing write: upload, then commit or abort). So every path is
// resolved by the container's own kernel in the container's own root —
// its read-only rootfs, its workspace volume or bind, its tmpfs /tmp and
// its extra mounts as the sandbox sees them — and permissions and file
// owners are the sandboxed user's. The Engine's archive endpoints are not
// used: they work on the container's rootfs from the daemon's side, miss
// the tmpfs /tmp, and write files with the tar's owners.
//
// The script resolves the path with readlink -f (the longest existing
// prefix; the rest is to be created) and refuses a result outside the
// session's mounts, which it gets as arguments: the rules are those of
// backends/files.go. A symlink swapped in between that check and the
// operation can only lead to another place in the container itself, never
// to the host.
//
// Data streams through the exec's stdin and stdout (stdcopy frames), so
// no call holds a whole file in memory.

// fsScript is run as: sh -c fsScript boxrt-fs OP MODE:MOUNT… -- ARGS…,
// every argument as printf octal escapes (shellArg): the Engine API carries
// exec arguments in JSON, which would turn a file name's non-UTF-8 bytes
// into U+FFFD.
// Failures print "<param>|<kind>: <detail>" on stderr and exit 3, param
// naming the argument at fault (path, from, to).
const fsScript = `
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
	r=$(readlink -f "$p" && echo x) || die failed "cannot resolve $1"
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
	if [ -z "$mode" ]; then mode=644; [ -f "$R" ] && mode=$(stat -c %a "$R"); fi
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

// fsMounts are the mount arguments of fsScript: MODE:PATH of the
// session's mounts and the tmpfs /tmp.
func fsMounts(info backends.Session) []string {
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

// fsRun is one running exec of fsScript.
type fsRun struct {
	b      *Backend
	info   backends.Session
	id     string
	conn   io.Closer
	stdout *io.PipeReader
	stderr *limitedBuffer
	done   chan struct{}
	err    error // of the stream, valid after done
	// fed is closed once stdin's copy has ended (at once without stdin),
	// so nobody reads the caller's reader after wait.
	fed chan struct{}
}

// startFS starts fsScript op in the container; stdin (when not nil) is
// copied to the script's stdin, then closed.
func (b *Backend) startFS(ctx context.Context, info backends.Session, stdin io.Reader, op string, args ...string) (*fsRun, error) {
	cmd := []string{"sh", "-c", fsScript, "boxrt-fs"}
	for _, a := range append(append(append([]string{op}, fsMounts(info)...), "--"), args...) {
		cmd = append(cmd, shellArg(a))
	}
	created, err := b.cli.ContainerExecCreate(ctx, info.BackendSessionID, container.ExecOptions{
		AttachStdin:  stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
		WorkingDir:   "/",
		Cmd:          cmd,
	})
	if err != nil {
		return nil, b.sessionError(info, "file "+op+" in "+info.BackendSessionID, err)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, b.sessionError(info, "file "+op+" in "+info.BackendSessionID, err)
	}
	pr, pw := io.Pipe()
	r := &fsRun{b: b, info: info, id: created.ID, conn: hj.Conn, stdout: pr, stderr: &limitedBuffer{max: 4096}, done: make(chan struct{}), fed: make(chan struct{})}
	go func() {
		defer close(r.done)
		_, r.err = stdcopy.StdCopy(pw, r.stderr, hj.Reader)
		pw.CloseWithError(r.err)
	}()
	if stdin != nil {
		go func() {
			defer close(r.fed)
			// A source that fails ends the script's stdin like a finished
			// one; the caller, which sees the failure, then aborts
			// instead of committing.
			_, _ = io.Copy(hj.Conn, stdin)
			_ = hj.CloseWrite()
		}()
	} else {
		close(r.fed)
	}
	// A cancelled caller ends the exec's streams.
	stop := context.AfterFunc(ctx, func() { hj.Close() })
	go func() {
		<-r.done
		stop()
	}()
	return r, nil
}

// wait drains what is left of stdout, waits for the exec and turns a
// failure into a typed error about the parameters params (name → value).
func (r *fsRun) wait(params ...string) error {
	_, _ = io.Copy(io.Discard, r.stdout)
	<-r.done
	r.conn.Close()
	<-r.fed
	if r.err != nil {
		return boxerr.Failure("docker: file call on %s: %v", params[1], r.err).Wrap(r.err)
	}
	ctx, cancel := cleanupContext(context.Background(), helperTimeout)
	defer cancel()
	code, err := r.b.execExitCode(ctx, r.id)
	if err != nil {
		return r.b.sessionError(r.info, "file call result", err)
	}
	if code == 0 {
		return nil
	}
	return scriptError(params, code, strings.TrimSpace(r.stderr.String()))
}

// scriptError maps fsScript's "<param>|<kind>: <detail>" to a typed
// error; params are the call's (name, value) pairs.
func scriptError(params []string, code int, msg string) error {
	field, p := params[0], params[1]
	param, rest, _ := strings.Cut(msg, "|")
	for i := 0; i+1 < len(params); i += 2 {
		if params[i] == param {
			field, p = params[i], params[i+1]
		}
	}
	kind, detail, _ := strings.Cut(rest, ": ")
	refuse := func(why string) error {
		return boxerr.Validation(field, "%s %s: %s", field, p, why).With("path", p)
	}
	switch {
	case code != 3:
		return boxerr.Failure("docker: file call on %s exited with %d: %s", p, code, msg).With("path", p)
	case kind == "notfound":
		return boxerr.FileNotFound(p)
	case kind == "outside":
		return backends.OutsideMounts(field, p, detail)
	case kind == "readonly":
		return backends.ReadOnlyPath(field, p)
	case kind == "notdir":
		return refuse("not a directory")
	case kind == "notfile":
		return refuse("not a regular file")
	case kind == "isdir":
		return refuse("is a directory")
	case kind == "notempty":
		return refuse("directory not empty (use recursive)")
	case kind == "exists":
		return refuse("already exists and is not a directory")
	case kind == "mountpoint":
		return refuse("is a mount point or holds one")
	case kind == "xdev":
		return refuse("is on another mount than from (rename cannot move between mounts)")
	}
	return boxerr.Failure("docker: %s %s: %s", field, p, detail).With("path", p)
}

// output runs op without stdin and returns its whole stdout (small: a
// stat line, a listing).
func (b *Backend) output(ctx context.Context, info backends.Session, params []string, op string, args ...string) ([]byte, error) {
	r, err := b.startFS(ctx, info, nil, op, args...)
	if err != nil {
		return nil, err
	}
	out, rerr := io.ReadAll(r.stdout)
	if err := r.wait(params...); err != nil {
		return nil, err
	}
	return out, rerr
}

// StatFile implements runtime.FileSystem.
func (b *Backend) StatFile(ctx context.Context, info backends.Session, p string) (backends.FileInfo, error) {
	out, err := b.output(ctx, info, []string{"path", p}, "stat", p)
	if err != nil {
		return backends.FileInfo{}, err
	}
	return parseStat(path.Base(p), p, strings.TrimSpace(string(out)))
}

// parseStat reads stat -c '%f %s %Y': the raw mode in hex, size, mtime.
func parseStat(name, p, line string) (backends.FileInfo, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return backends.FileInfo{}, boxerr.Failure("docker: unexpected stat output for %s: %q", p, line)
	}
	raw, err1 := strconv.ParseUint(f[0], 16, 32)
	size, err2 := strconv.ParseInt(f[1], 10, 64)
	mtime, err3 := strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return backends.FileInfo{}, boxerr.Failure("docker: unexpected stat output for %s: %q", p, line)
	}
	typ := backends.FileTypeOther
	switch raw & 0o170000 {
	case 0o100000:
		typ = backends.FileTypeFile
	case 0o040000:
		typ = backends.FileTypeDir
	case 0o120000:
		typ = backends.FileTypeSymlink
	}
	return backends.FileInfo{Name: name, Path: p, Type: typ, Size: size, Mode: uint32(raw & 0o7777),
		MTime: time.Unix(mtime, 0).UTC()}, nil
}

// ListFiles implements runtime.FileSystem: find in the container, one
// stat line and one NUL-terminated path per entry (names may hold any
// byte but NUL).
func (b *Backend) ListFiles(ctx context.Context, info backends.Session, dir string, depth, limit int) ([]backends.FileInfo, error) {
	out, err := b.output(ctx, info, []string{"path", dir}, "list", dir, strconv.Itoa(depth))
	if err != nil {
		return nil, err
	}
	resolved, rest, ok := bytes.Cut(out, []byte("\n"))
	if !ok {
		return nil, boxerr.Failure("docker: unexpected listing of %s", dir)
	}
	var entries []backends.FileInfo
	for len(rest) > 0 && len(entries) < limit {
		line, after, ok1 := bytes.Cut(rest, []byte("\n"))
		name, after, ok2 := bytes.Cut(after, []byte{0})
		if !ok1 || !ok2 {
			return nil, boxerr.Failure("docker: unexpected listing of %s", dir)
		}
		rest = after
		rel := strings.TrimPrefix(strings.TrimPrefix(string(name), string(resolved)), "/")
		fi, err := parseStat(path.Base(rel), path.Join(dir, rel), string(line))
		if err != nil {
			return nil, err
		}
		entries = append(entries, fi)
	}
	return entries, nil
}

// ReadFile implements runtime.FileSystem: one exec, whose first line is
// the file's stat (after the last symlink), then its bytes.
func (b *Backend) ReadFile(ctx context.Context, info backends.Session, p string, offset, length int64) (io.ReadCloser, backends.FileInfo, error) {
	r, err := b.startFS(ctx, info, nil, "read", p, strconv.FormatInt(offset, 10), strconv.FormatInt(length, 10))
	if err != nil {
		return nil, backends.FileInfo{}, err
	}
	br := bufio.NewReaderSize(r.stdout, 64<<10)
	line, rerr := br.ReadString('\n')
	if rerr != nil {
		if err := r.wait("path", p); err != nil {
			return nil, backends.FileInfo{}, err
		}
		return nil, backends.FileInfo{}, boxerr.Failure("docker: reading %s: %v", p, rerr)
	}
	fi, err := parseStat(path.Base(p), p, strings.TrimSpace(line))
	if err != nil {
		r.conn.Close()
		_ = r.wait("path", p)
		return nil, fi, err
	}
	return &fsReader{r: r, br: br, p: p}, fi, nil
}

// fsReader streams a read's stdout; Close ends the exec (early, when the
// caller stops reading) and reports its failure.
type fsReader struct {
	r    *fsRun
	br   *bufio.Reader
	p    string
	once sync.Once
	err  error
}

func (f *fsReader) Read(p []byte) (int, error) {
	n, err := f.br.Read(p)
	if err == io.EOF {
		// The end of stdout: say EOF only when the script succeeded.
		if werr := f.close(); werr != nil {
			return n, werr
		}
	}
	return n, err
}

func (f *fsReader) close() error {
	f.once.Do(func() { f.err = f.r.wait("path", f.p) })
	return f.err
}

func (f *fsReader) Close() error {
	f.r.conn.Close()
	err := f.close()
	if errors.Is(err, boxerr.ErrBox) {
		// Stopped early on purpose: the broken stream is ours.
		return nil
	}
	return err
}

// WriteFile implements runtime.FileSystem: upload streams r into a
// temporary file the script made next to the target; commit renames it
// over the target only when the upload completed, abort removes it.
func (b *Backend) WriteFile(ctx context.Context, info backends.Session, p string, src io.Reader, opts backends.WriteOptions) (int64, error) {
	mode := ""
	if opts.Mode != 0 {
		mode = fmt.Sprintf("%o", opts.Mode.Perm())
	}
	how := "replace"
	if opts.Append {
		how = "append"
	}
	counted := &countingReader{r: src}
	r, err := b.startFS(ctx, info, counted, "upload", p, mode, how)
	if err != nil {
		return 0, err
	}
	var tmp string
	if !opts.Append {
		line, rerr := bufio.NewReader(r.stdout).ReadString('\n')
		tmp = strings.TrimSuffix(line, "\n")
		if rerr != nil {
			tmp = ""
		}
	}
	werr := r.wait("path", p)
	if werr == nil && counted.err != nil {
		werr = boxerr.Failure("upload of %s broke off: %v", p, counted.err).Wrap(counted.err)
	}
	if opts.Append || tmp == "" {
		return counted.n, werr
	}
	cctx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	if werr != nil {
		if ar, err := b.startFS(cctx, info, nil, "abort", tmp); err == nil {
			_ = ar.wait("path", p)
		}
		return counted.n, werr
	}
	cr, err := b.startFS(cctx, info, nil, "commit", p, mode, tmp)
	if err != nil {
		return counted.n, err
	}
	return counted.n, cr.wait("path", p)
}

// countingReader counts what passed and keeps the source's own failure
// (as opposed to its end).
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// RemoveFile implements runtime.FileSystem.
func (b *Backend) RemoveFile(ctx context.Context, info backends.Session, p string, recursive bool) error {
	how := "one"
	if recursive {
		how = "recursive"
	}
	_, err := b.output(ctx, info, []string{"path", p}, "remove", p, how)
	return err
}

// MakeDir implements runtime.FileSystem.
func (b *Backend) MakeDir(ctx context.Context, info backends.Session, p string) error {
	_, err := b.output(ctx, info, []string{"path", p}, "mkdir", p)
	return err
}

// RenameFile implements runtime.FileSystem.
func (b *Backend) RenameFile(ctx context.Context, info backends.Session, from, to string) error {
	_, err := b.output(ctx, info, []string{"from", from, "to", to}, "rename", from, to)
	return err
}

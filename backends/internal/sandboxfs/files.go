package sandboxfs

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

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Runner starts commands in a session's container.
type Runner interface {
	// Run starts argv in the container. stdin, when not nil, is copied to
	// the command's stdin, then closed (nil: an empty stdin).
	Run(ctx context.Context, info backends.Session, stdin io.Reader, argv []string) (Run, error)
}

// Run is one running command.
type Run interface {
	// Stdout is the command's output; it ends (EOF, or the stream's
	// error) when the stream does.
	Stdout() io.Reader
	// Wait waits for the end of the command and of the copy of its stdin
	// (the caller's reader is not used after Wait), and returns its exit
	// code and the start of its stderr. err is the stream's failure; a
	// *boxerr.Error is passed on as it is.
	Wait() (code int, stderr string, err error)
	// Cancel ends the command's streams early.
	Cancel()
}

// FS implements runtime.FileSystem on a Runner.
type FS struct {
	// Backend names the backend in error messages.
	Backend string
	Runner  Runner
}

// cleanupTimeout bounds the call that commits or aborts an upload, which
// runs even when the caller's context has ended.
const cleanupTimeout = 15 * time.Second

// run is one running Script call.
type run struct {
	fs Run
	be string
}

func (f FS) start(ctx context.Context, info backends.Session, stdin io.Reader, op string, args ...string) (*run, error) {
	r, err := f.Runner.Run(ctx, info, stdin, Command(info, op, args...))
	if err != nil {
		return nil, err
	}
	return &run{fs: r, be: f.Backend}, nil
}

// checkPaths validates the paths of a call (name, value pairs) as the
// runtime does before it calls a backend: the script cannot tell a name
// the kernel found too long from any other failure.
func checkPaths(params ...string) error {
	for i := 0; i+1 < len(params); i += 2 {
		if _, err := backends.CheckSandboxPath(params[i], params[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// wait drains what is left of stdout, waits for the command and turns a
// failure into a typed error about the parameters params (name → value).
func (r *run) wait(params ...string) error {
	_, _ = io.Copy(io.Discard, r.fs.Stdout())
	code, stderr, err := r.fs.Wait()
	if err != nil {
		var be *boxerr.Error
		if errors.As(err, &be) {
			return err
		}
		return boxerr.Failure("%s: file call on %s: %v", r.be, params[1], err).Wrap(err)
	}
	if code == 0 {
		return nil
	}
	return scriptError(r.be, params, code, strings.TrimSpace(stderr))
}

// scriptError maps Script's "<param>|<kind>: <detail>" to a typed error;
// params are the call's (name, value) pairs.
func scriptError(be string, params []string, code int, msg string) error {
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
		return boxerr.Failure("%s: file call on %s exited with %d: %s", be, p, code, msg).With("path", p)
	case kind == "notfound":
		return boxerr.FileNotFound(p)
	case kind == "outside":
		return backends.OutsideMounts(field, p, detail)
	case kind == "readonly":
		return backends.ReadOnlyPath(field, p)
	case kind == "unresolvable":
		// readlink -f failed on the part that exists: a symlink on the
		// path dangles, loops or cannot be read (gVisor refuses to read
		// /proc/<pid>/root, which runc resolves to "/" and so "outside").
		// Where it would lead is unknown, so it is refused like an escape.
		return refuse("cannot be resolved in the sandbox (a symlink on it dangles, loops or cannot be read)")
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
	return boxerr.Failure("%s: %s %s: %s", be, field, p, detail).With("path", p)
}

// output runs op without stdin and returns its whole stdout (small: a
// stat line, a listing).
func (f FS) output(ctx context.Context, info backends.Session, params []string, op string, args ...string) ([]byte, error) {
	if err := checkPaths(params...); err != nil {
		return nil, err
	}
	r, err := f.start(ctx, info, nil, op, args...)
	if err != nil {
		return nil, err
	}
	out, rerr := io.ReadAll(r.fs.Stdout())
	if err := r.wait(params...); err != nil {
		return nil, err
	}
	return out, rerr
}

// StatFile implements runtime.FileSystem.
func (f FS) StatFile(ctx context.Context, info backends.Session, p string) (backends.FileInfo, error) {
	out, err := f.output(ctx, info, []string{"path", p}, "stat", p)
	if err != nil {
		return backends.FileInfo{}, err
	}
	return f.parseStat(path.Base(p), p, strings.TrimSpace(string(out)))
}

// parseStat reads stat -c '%f %s %Y': the raw mode in hex, size, mtime.
func (f FS) parseStat(name, p, line string) (backends.FileInfo, error) {
	fields := strings.Fields(line)
	if len(fields) != 3 {
		return backends.FileInfo{}, boxerr.Failure("%s: unexpected stat output for %s: %q", f.Backend, p, line)
	}
	raw, err1 := strconv.ParseUint(fields[0], 16, 32)
	size, err2 := strconv.ParseInt(fields[1], 10, 64)
	mtime, err3 := strconv.ParseInt(fields[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return backends.FileInfo{}, boxerr.Failure("%s: unexpected stat output for %s: %q", f.Backend, p, line)
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
func (f FS) ListFiles(ctx context.Context, info backends.Session, dir string, depth, limit int) ([]backends.FileInfo, error) {
	out, err := f.output(ctx, info, []string{"path", dir}, "list", dir, strconv.Itoa(depth))
	if err != nil {
		return nil, err
	}
	resolved, rest, ok := bytes.Cut(out, []byte("\n"))
	if !ok {
		return nil, boxerr.Failure("%s: unexpected listing of %s", f.Backend, dir)
	}
	var entries []backends.FileInfo
	for len(rest) > 0 && len(entries) < limit {
		line, after, ok1 := bytes.Cut(rest, []byte("\n"))
		name, after, ok2 := bytes.Cut(after, []byte{0})
		if !ok1 || !ok2 {
			return nil, boxerr.Failure("%s: unexpected listing of %s", f.Backend, dir)
		}
		rest = after
		rel := strings.TrimPrefix(strings.TrimPrefix(string(name), string(resolved)), "/")
		fi, err := f.parseStat(path.Base(rel), path.Join(dir, rel), string(line))
		if err != nil {
			return nil, err
		}
		entries = append(entries, fi)
	}
	return entries, nil
}

// ReadFile implements runtime.FileSystem: one exec, whose first line is
// the file's stat (after the last symlink), then its bytes.
func (f FS) ReadFile(ctx context.Context, info backends.Session, p string, offset, length int64) (io.ReadCloser, backends.FileInfo, error) {
	if err := checkPaths("path", p); err != nil {
		return nil, backends.FileInfo{}, err
	}
	r, err := f.start(ctx, info, nil, "read", p, strconv.FormatInt(offset, 10), strconv.FormatInt(length, 10))
	if err != nil {
		return nil, backends.FileInfo{}, err
	}
	br := bufio.NewReaderSize(r.fs.Stdout(), 64<<10)
	line, rerr := br.ReadString('\n')
	if rerr != nil {
		if err := r.wait("path", p); err != nil {
			return nil, backends.FileInfo{}, err
		}
		return nil, backends.FileInfo{}, boxerr.Failure("%s: reading %s: %v", f.Backend, p, rerr)
	}
	fi, err := f.parseStat(path.Base(p), p, strings.TrimSpace(line))
	if err != nil {
		r.fs.Cancel()
		_ = r.wait("path", p)
		return nil, fi, err
	}
	return &reader{r: r, br: br, p: p}, fi, nil
}

// reader streams a read's stdout; Close ends the exec (early, when the
// caller stops reading) and reports its failure.
type reader struct {
	r    *run
	br   *bufio.Reader
	p    string
	once sync.Once
	err  error
}

func (f *reader) Read(p []byte) (int, error) {
	n, err := f.br.Read(p)
	if err == io.EOF {
		// The end of stdout: say EOF only when the script succeeded.
		if werr := f.close(); werr != nil {
			return n, werr
		}
	}
	return n, err
}

func (f *reader) close() error {
	f.once.Do(func() { f.err = f.r.wait("path", f.p) })
	return f.err
}

func (f *reader) Close() error {
	f.r.fs.Cancel()
	err := f.close()
	if errors.Is(err, boxerr.ErrBox) {
		// Stopped early on purpose: the broken stream is ours.
		return nil
	}
	return err
}

// WriteFile implements runtime.FileSystem: upload streams src into a
// temporary file the script made next to the target; commit renames it
// over the target only when the upload completed, abort removes it.
func (f FS) WriteFile(ctx context.Context, info backends.Session, p string, src io.Reader, opts backends.WriteOptions) (int64, error) {
	if err := checkPaths("path", p); err != nil {
		return 0, err
	}
	mode := ""
	if opts.Mode != 0 {
		mode = fmt.Sprintf("%o", opts.Mode.Perm())
	}
	how := "replace"
	if opts.Append {
		how = "append"
	}
	counted := &countingReader{r: src}
	gate := &gatedReader{r: counted, open: make(chan struct{})}
	r, err := f.start(ctx, info, gate, "upload", p, mode, how)
	if err != nil {
		return 0, err
	}
	// The script's first line (the temporary file; empty when appending)
	// says its checks passed and it reads stdin; only then does data go.
	line, rerr := bufio.NewReader(r.fs.Stdout()).ReadString('\n')
	gate.release(rerr == nil)
	var tmp string
	if !opts.Append && rerr == nil {
		tmp = strings.TrimSuffix(line, "\n")
	}
	werr := r.wait("path", p)
	if werr == nil && counted.err != nil {
		werr = boxerr.Failure("upload of %s broke off: %v", p, counted.err).Wrap(counted.err)
	}
	if opts.Append || tmp == "" {
		return counted.n, werr
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if werr != nil {
		if ar, err := f.start(cctx, info, nil, "abort", tmp); err == nil {
			_ = ar.wait("path", p)
		}
		return counted.n, werr
	}
	cr, err := f.start(cctx, info, nil, "commit", p, mode, tmp)
	if err != nil {
		return counted.n, err
	}
	return counted.n, cr.wait("path", p)
}

// gatedReader holds back an upload's data until the script is ready for
// it. A script that refuses the call exits without reading stdin, and
// Podman (conmon) drops the exec's pending output, the refusal's stderr
// with it, when stdin data arrives as the process exits; so a refused
// upload sends no data, and its stdin is only closed.
type gatedReader struct {
	r    io.Reader
	open chan struct{}
	send bool // valid once open is closed
}

// release lets the data go (send) or ends stdin without any (!send).
func (g *gatedReader) release(send bool) {
	g.send = send
	close(g.open)
}

func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.open
	if !g.send {
		return 0, io.EOF
	}
	return g.r.Read(p)
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
func (f FS) RemoveFile(ctx context.Context, info backends.Session, p string, recursive bool) error {
	how := "one"
	if recursive {
		how = "recursive"
	}
	_, err := f.output(ctx, info, []string{"path", p}, "remove", p, how)
	return err
}

// MakeDir implements runtime.FileSystem.
func (f FS) MakeDir(ctx context.Context, info backends.Session, p string) error {
	_, err := f.output(ctx, info, []string{"path", p}, "mkdir", p)
	return err
}

// RenameFile implements runtime.FileSystem.
func (f FS) RenameFile(ctx context.Context, info backends.Session, from, to string) error {
	_, err := f.output(ctx, info, []string{"from", from, "to", to}, "rename", from, to)
	return err
}

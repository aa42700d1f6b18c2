package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem"
)

// The file API goes to envd's filesystem service and /files. Paths are
// resolved by envd in the sandbox (symlinks included), as its commands
// see them; the sandbox is remote, so nothing of the host is reachable
// through it. Appending and modes, which envd's file API lacks, are
// commands in the sandbox (cat >>, chmod).

// infoOf is a FileInfo from an envd entry, at the path the caller named.
func infoOf(e *filesystem.EntryInfo, p string) backends.FileInfo {
	fi := backends.FileInfo{Name: e.GetName(), Path: p, Size: max(0, e.GetSize()), Mode: e.GetMode() & 0o7777,
		MTime: e.GetModifiedTime().AsTime()}
	if fi.Name == "" {
		fi.Name = path.Base(p)
	}
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_FILE:
		fi.Type = backends.FileTypeFile
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		fi.Type = backends.FileTypeDir
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		fi.Type = backends.FileTypeSymlink
	default:
		fi.Type = backends.FileTypeOther
	}
	return fi.Encoded()
}

// StatFile implements runtime.FileSystem.
func (b *Backend) StatFile(ctx context.Context, info backends.Session, p string) (backends.FileInfo, error) {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return backends.FileInfo{}, err
	}
	return sb.stat(ctx, p)
}

func (sb *sandbox) stat(ctx context.Context, p string) (backends.FileInfo, error) {
	ctx, cancel := unary(ctx)
	defer cancel()
	resp, err := sb.files.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: p}))
	if err != nil {
		return backends.FileInfo{}, envdError("path", p, err)
	}
	return infoOf(resp.Msg.GetEntry(), p), nil
}

// ListFiles implements runtime.FileSystem.
func (b *Backend) ListFiles(ctx context.Context, info backends.Session, dir string, depth, limit int) ([]backends.FileInfo, error) {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return nil, err
	}
	ctx, cancel := unary(ctx)
	defer cancel()
	resp, err := sb.files.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: dir, Depth: uint32(depth)}))
	if err != nil {
		return nil, envdError("path", dir, err)
	}
	var out []backends.FileInfo
	for _, e := range resp.Msg.GetEntries() {
		p := path.Clean(e.GetPath())
		if !strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/") {
			return nil, boxerr.Failure("e2b backend: envd listed %.200q, which is not below %s", e.GetPath(), dir)
		}
		if len(out) == limit {
			break
		}
		out = append(out, infoOf(e, p))
	}
	return out, nil
}

// ReadFile implements runtime.FileSystem: /files' download, from offset,
// never more than the file's size as stat saw it.
func (b *Backend) ReadFile(ctx context.Context, info backends.Session, p string, offset, length int64) (io.ReadCloser, backends.FileInfo, error) {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return nil, backends.FileInfo{}, err
	}
	fi, err := sb.stat(ctx, p)
	if err != nil {
		return nil, fi, err
	}
	if fi.Type != backends.FileTypeFile {
		return nil, fi, boxerr.Validation("path", "path %s is not a regular file (%s)", p, fi.Type).With("path", p)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sb.base+"/files?"+url.Values{"path": {p}}.Encode(), nil)
	if err != nil {
		return nil, fi, boxerr.Failure("e2b backend: %v", err).Wrap(err)
	}
	resp, err := sb.http.Do(req)
	if err != nil {
		return nil, fi, boxerr.Failure("e2b backend: downloading %s: %v", p, err).Wrap(errors.Join(errGone, err))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fi, filesError(p, resp)
	}
	if offset > 0 {
		if _, err := io.CopyN(io.Discard, resp.Body, min(offset, fi.Size)); err != nil {
			resp.Body.Close()
			return nil, fi, boxerr.Failure("e2b backend: downloading %s: %v", p, err).Wrap(err)
		}
	}
	n := max(0, fi.Size-offset)
	if length >= 0 {
		n = min(n, length)
	}
	return readCloser{Reader: io.LimitReader(resp.Body, n), Closer: resp.Body}, fi, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// filesError is a refused /files call as a typed error.
func filesError(p string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	what := fmt.Sprintf("%s: envd answered %d: %s", p, resp.StatusCode, quote(string(bytes.TrimSpace(body))))
	switch resp.StatusCode {
	case http.StatusNotFound:
		return boxerr.FileNotFound(p)
	case http.StatusBadRequest, http.StatusForbidden:
		return boxerr.Validation("path", "path %s", what).With("path", p)
	case http.StatusBadGateway:
		return boxerr.Failure("e2b backend: %s", what).Wrap(errGone)
	}
	return boxerr.Failure("e2b backend: %s", what)
}

// WriteFile implements runtime.FileSystem: /files' upload (envd writes
// it whole), or with opts.Append a `cat >>` fed the data; a mode is a
// chmod after.
func (b *Backend) WriteFile(ctx context.Context, info backends.Session, p string, r io.Reader, opts backends.WriteOptions) (int64, error) {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return 0, err
	}
	cr := &counter{r: r}
	if opts.Append {
		err = b.shell(ctx, info, `mkdir -p -- "$(dirname -- "$1")" && cat >> "$1"`, p, io.NopCloser(cr))
	} else {
		err = sb.upload(ctx, p, cr)
	}
	if err != nil {
		return cr.n, err
	}
	if opts.Mode != 0 {
		err = b.shell(ctx, info, fmt.Sprintf(`chmod %o "$1"`, opts.Mode.Perm()|opts.Mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)), p, nil)
	}
	return cr.n, err
}

type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// upload streams r to envd's /files as one multipart part.
func (sb *sandbox) upload(ctx context.Context, p string, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan struct{})
	go func() {
		defer close(done)
		part, err := mw.CreateFormFile("file", path.Base(p))
		if err == nil {
			_, err = io.Copy(part, r)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sb.base+"/files?"+url.Values{"path": {p}}.Encode(), pr)
	if err != nil {
		pr.CloseWithError(err)
		<-done
		return boxerr.Failure("e2b backend: %v", err).Wrap(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := sb.http.Do(req)
	pr.CloseWithError(errors.New("upload ended")) // ends the writer goroutine
	<-done
	if err != nil {
		return boxerr.Failure("e2b backend: uploading %s: %v", p, err).Wrap(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return filesError(p, resp)
	}
	return nil
}

// shell runs script with $1 = arg in the session, stdin from in, and
// fails unless it exits 0.
func (b *Backend) shell(ctx context.Context, info backends.Session, script, arg string, in io.ReadCloser) error {
	var errOut bytes.Buffer
	st, err := b.Exec(ctx, info, backends.ExecRequest{Cmd: "set -- " + shellWord(arg) + "; " + script, Stdin: in,
		Stderr: &limitedBuffer{b: &errOut, n: 4096}, Stdout: io.Discard, Timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	if st.TimedOut || st.ExitCode != 0 {
		return boxerr.Validation("path", "path %s: %s", arg, quote(errOut.String())).With("path", arg)
	}
	return nil
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// RemoveFile implements runtime.FileSystem. envd removes recursively, so
// a non-recursive remove of a directory with entries is refused first.
func (b *Backend) RemoveFile(ctx context.Context, info backends.Session, p string, recursive bool) error {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return err
	}
	if !recursive {
		fi, err := sb.stat(ctx, p)
		if err != nil {
			return err
		}
		if fi.Type == backends.FileTypeDir {
			entries, err := b.ListFiles(ctx, info, p, 1, 1)
			if err != nil {
				return err
			}
			if len(entries) > 0 {
				return boxerr.Validation("path", "path %s: directory not empty (use recursive)", p).With("path", p)
			}
		}
	}
	ctx, cancel := unary(ctx)
	defer cancel()
	_, err = sb.files.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: p}))
	return envdError("path", p, err)
}

// MakeDir implements runtime.FileSystem: an existing directory is fine.
func (b *Backend) MakeDir(ctx context.Context, info backends.Session, p string) error {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return err
	}
	uctx, cancel := unary(ctx)
	defer cancel()
	_, err = sb.files.MakeDir(uctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: p}))
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		fi, serr := sb.stat(ctx, p)
		if serr == nil && fi.Type == backends.FileTypeDir {
			return nil
		}
		return boxerr.Validation("path", "path %s: already exists", p).With("path", p)
	}
	return envdError("path", p, err)
}

// RenameFile implements runtime.FileSystem.
func (b *Backend) RenameFile(ctx context.Context, info backends.Session, from, to string) error {
	sb, err := b.envd(ctx, info)
	if err != nil {
		return err
	}
	ctx, cancel := unary(ctx)
	defer cancel()
	_, err = sb.files.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: from, Destination: to}))
	return envdError("path", from, err)
}

package cli

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

func cpCommand() *cli.Command {
	return &cli.Command{
		Name:      "cp",
		Usage:     "copy a file between this machine and a session",
		ArgsUsage: "SRC DST",
		Description: `Copies one file into or out of a session through the runtime's files
endpoint (GET/PUT /v1/sessions/<id>/files), which streams: any size, with
the runtime's memory flat. One of SRC and DST is SESSION:/PATH (a path as
the sandbox sees it), the other a local path; "-" is stdin or stdout.
Uploads create missing directories and replace the file atomically once
complete; downloads are written to a temporary name and renamed. Progress
goes to stderr when stderr is a terminal (--progress=false turns it off,
--progress forces it). Flags may come before or after the arguments.

` + targetHelp + `

Examples:
  boxrt cp ./data.csv s1:/workspace/data.csv --url http://127.0.0.1:5410
  boxrt cp s1:/workspace/out/report.pdf . --url http://127.0.0.1:5410
  tar c src | boxrt cp - s1:/tmp/src.tar`,
		Flags: append(targetFlags(false),
			&cli.StringFlag{Name: "mode", Usage: "octal mode of an uploaded file (default: keep an existing file's, else 0644)"},
			&cli.BoolFlag{Name: "progress", DefaultText: "on when stderr is a terminal", Usage: "show progress on stderr"},
		),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return cpUsage("%v", err) },
		Action:       flagsAnywhere("cp", runCp),
	}
}

var cpUsage = usageOf("cp")

// sessionPath splits "SESSION:/PATH"; a local path never matches (its
// part before ":/" would hold a "/"; write ./a:/b for such a file).
func sessionPath(arg string) (session, p string, ok bool) {
	i := strings.Index(arg, ":/")
	if i <= 0 || strings.Contains(arg[:i], "/") {
		return "", "", false
	}
	return arg[:i], arg[i+1:], true
}

func runCp(c *cli.Context, args []string) error {
	if len(args) != 2 {
		return cpUsage("want SRC and DST, got %d arguments: %q", len(args), args)
	}
	src, dst := args[0], args[1]
	srcSession, srcPath, up := sessionPath(src)
	dstSession, dstPath, down := sessionPath(dst)
	if up == down {
		return cpUsage("exactly one of SRC and DST must be SESSION:/PATH")
	}
	var mode fs.FileMode
	if m := c.String("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o777 {
			return cpUsage("--mode must be octal permission bits, got %q", m)
		}
		mode = fs.FileMode(v)
	}
	t, err := readTarget(c, cpUsage)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	client, err := t.connect(ctx, c.App.ErrWriter)
	if err != nil {
		return &exitError{code: 1, msg: "cp: " + err.Error()}
	}
	defer client.Close()
	show := isTerminal(os.Stderr)
	if c.IsSet("progress") {
		show = c.Bool("progress")
	}
	var progress *progressMeter
	if show {
		progress = &progressMeter{w: c.App.ErrWriter}
	}
	if down {
		err = cpUp(ctx, client, src, dstSession, dstPath, mode, progress)
	} else {
		err = cpDown(ctx, client, srcSession, srcPath, dst, c.App.Writer, progress)
	}
	if err != nil {
		return &exitError{code: 1, msg: "cp: " + err.Error()}
	}
	return nil
}

func cpUp(ctx context.Context, client *reconnect.Client, src, session, p string, mode fs.FileMode, pm *progressMeter) error {
	var r io.Reader = os.Stdin
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil {
			if fi.IsDir() {
				return fmt.Errorf("%s is a directory (cp copies one file; tar it first)", src)
			}
			pm.setTotal(fi.Size())
		}
		r = f
	}
	if strings.HasSuffix(p, "/") {
		p += filepath.Base(src)
	}
	stop := pm.start()
	_, err := client.Upload(ctx, session, p, pm.reader(r), mode)
	stop()
	return err
}

func cpDown(ctx context.Context, client *reconnect.Client, session, p, dst string, stdout io.Writer, pm *progressMeter) error {
	if dst == "-" {
		stop := pm.start()
		_, err := client.Download(ctx, session, p, pm.writer(stdout))
		stop()
		return err
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(p))
	}
	if fi, err := client.StatFile(ctx, session, p); err == nil {
		pm.setTotal(fi.Size)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".boxrt-cp-*")
	if err != nil {
		return err
	}
	stop := pm.start()
	_, err = client.Download(ctx, session, p, pm.writer(tmp))
	stop()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}

// progressMeter prints bytes moved, percent and rate every half second;
// a nil meter counts nothing and prints nothing.
type progressMeter struct {
	w     io.Writer
	total int64
	n     atomic.Int64
}

func (pm *progressMeter) setTotal(n int64) {
	if pm != nil {
		pm.total = n
	}
}

func (pm *progressMeter) reader(r io.Reader) io.Reader {
	if pm == nil {
		return r
	}
	return readFunc(func(p []byte) (int, error) {
		n, err := r.Read(p)
		pm.n.Add(int64(n))
		return n, err
	})
}

func (pm *progressMeter) writer(w io.Writer) io.Writer {
	if pm == nil {
		return w
	}
	return writeFunc(func(p []byte) (int, error) {
		n, err := w.Write(p)
		pm.n.Add(int64(n))
		return n, err
	})
}

// start prints until the returned stop is called, then a last line.
func (pm *progressMeter) start() (stop func()) {
	if pm == nil {
		return func() {}
	}
	begin := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				pm.print(begin, "\r")
			case <-done:
				pm.print(begin, "\n")
				return
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

func (pm *progressMeter) print(begin time.Time, end string) {
	const mib = 1 << 20
	n := pm.n.Load()
	line := fmt.Sprintf("%.1f MiB", float64(n)/mib)
	if pm.total > 0 {
		line += fmt.Sprintf(" / %.1f MiB (%d%%)", float64(pm.total)/mib, n*100/pm.total)
	}
	if s := time.Since(begin).Seconds(); s > 0 {
		line += fmt.Sprintf(", %.1f MiB/s", float64(n)/mib/s)
	}
	fmt.Fprintf(pm.w, "%-60s%s", line, end)
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

type writeFunc func([]byte) (int, error)

func (f writeFunc) Write(p []byte) (int, error) { return f(p) }

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

package bwrap

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/boxrt/boxrt/backends/internal/loopdisk"
)

// Making and mounting a session's disk (an image, a loop device, an ext4
// mount) takes longer than everything else a new session and its first
// exec do together. So disks of the default size are made ahead of time:
// the pool keeps diskPoolSize of them — copies of a template formatted once
// (diskTemplate), mounted as detached mounts (attachDisk) — and
// StartSession takes one — a rename and a move_mount — while the pool
// refills in the background. A pooled disk is taken by exactly one session
// and never returned: no session sees another's data, nor a disk anyone
// used. Sessions with another workspace_quota_mb format theirs at start.
//
// Images wait in <StateDir>/bwrap/<InstanceID>/.pool/<backend token>/. The
// detached mounts vanish with boxrt (and their loop devices with them);
// Close removes the images, and Adopt those of earlier boxrt processes.
// A session started after Close formats its disk: a pool or template made
// then would outlive the Backend.

// diskPoolSize is how many disks wait: enough for a burst of a few
// sessions, few enough that idle disks cost little (a fresh image uses
// well under a MiB of host disk).
const diskPoolSize = 2

// diskPoolDir is the pool's directory below the instance directory (a
// name sessionDirRe never matches).
const diskPoolDir = ".pool"

// pooledDisk is a formatted image and its detached mount.
type pooledDisk struct {
	img string
	mnt *os.File
}

// release unmounts (by closing the last descriptor of the detached mount)
// and deletes the image.
func (d *pooledDisk) release() {
	if d.mnt != nil {
		d.mnt.Close()
	}
	_ = os.Remove(d.img)
}

type diskPool struct {
	tmpl loopdisk.Template // the default-size template (diskTemplate)

	mu      sync.Mutex
	ready   []*pooledDisk
	filling bool
	closed  bool
	seq     int
	wg      sync.WaitGroup
}

// poolDir is this Backend's pool directory.
func (b *Backend) poolDir() string {
	return filepath.Join(b.root, diskPoolDir, b.token)
}

// diskTemplate returns the Backend's formatted default-size image, made on
// first use, which default-size disks are copies of; "" once the pool's
// close has removed it (see loopdisk.Template).
func (b *Backend) diskTemplate() (string, error) {
	return b.pool.tmpl.Get(filepath.Join(b.poolDir(), "template.img"), func(p string) error {
		return b.formatDisk(p, DefaultQuotaMB)
	})
}

// take returns a pooled disk (nil when none is ready) and makes sure the
// pool is refilling. The first take starts the pool: a Backend that never
// starts a session formats nothing.
func (p *diskPool) take(b *Backend) *pooledDisk {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var d *pooledDisk
	if n := len(p.ready); n > 0 {
		d, p.ready = p.ready[n-1], p.ready[:n-1]
	}
	if !p.filling {
		p.filling = true
		p.wg.Add(1)
		go p.fill(b)
	}
	return d
}

// fill makes disks until the pool is full or closed. It stops at the first
// error: StartSession then formats its own disk and reports the cause.
func (p *diskPool) fill(b *Backend) {
	defer p.wg.Done()
	dir := b.poolDir()
	err := os.MkdirAll(dir, 0o700)
	for {
		p.mu.Lock()
		if err != nil || p.closed || len(p.ready) >= diskPoolSize {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.seq++
		img := filepath.Join(dir, strconv.Itoa(p.seq)+".img")
		p.mu.Unlock()
		var d *pooledDisk
		if d, err = b.newDisk(img, DefaultQuotaMB); err == nil {
			p.mu.Lock()
			if p.closed {
				d.release()
			} else {
				p.ready = append(p.ready, d)
			}
			p.mu.Unlock()
		}
	}
}

// close releases the waiting disks once a running refill has stopped.
func (p *diskPool) close(dir string) {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, d := range ready {
		d.release()
	}
	p.tmpl.Close()
	_ = os.Remove(dir)
	_ = os.Remove(filepath.Dir(dir)) // when no other pool is left
}

// removeStalePools deletes the images that earlier boxrt processes of
// this installation left in their pools (their mounts died with them).
func (b *Backend) removeStalePools() {
	parent := filepath.Join(b.root, diskPoolDir)
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if e.Name() != b.token {
			_ = os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}

// Close releases what the Backend holds besides sessions' files: the disks
// waiting in its pool and the sessions' resident sandboxes (processes end,
// as they would with boxrt). Sessions stay (Adopt finds them again).
func (b *Backend) Close() error {
	b.stopIdleLoop()
	open := b.openSessions()
	for _, sf := range open {
		if sf.res.closeOrDetach() {
			// As when boxrt exits: the next one starts it again.
			sf.detachNet()
			continue
		}
		sf.releaseCgroup()
	}
	b.pool.close(b.poolDir())
	// The instance's stage directory goes once no session's stage is in
	// it (a sandbox left running for the next boxrt keeps its own).
	if b.id.cred != nil {
		_ = os.Remove(filepath.Join(stageRoot, b.cfg.InstanceID))
	}
	return nil
}

// openSessions is a snapshot of the sessions open in this backend.
func (b *Backend) openSessions() []*sessionFiles {
	b.mu.Lock()
	defer b.mu.Unlock()
	open := make([]*sessionFiles, 0, len(b.open))
	for _, sf := range b.open {
		open = append(open, sf)
	}
	return open
}

// Package loopdisk owns the sessions' disks of the bwrap and docker
// backends: a sparse ext4 image (Format, or CopySparse of a Template
// formatted once), bound to a free loop device that clears itself and
// mounted with fsopen/fsconfig/fsmount as a detached mount (Attach), which
// Place attaches at a path. No mount(8), losetup or mkfs per disk: those
// scan every bound loop device, and their cost grew with the number of
// sessions. Unmounting the filesystem's last mount frees its loop device.
//
// The backends decide where images live, what is in them and who owns
// them; this package only makes, binds and mounts them.
package loopdisk

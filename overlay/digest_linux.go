//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// Every file entry with data records an XXH3-64 digest of its content (Entry.Sum), computed
// while the content is copied into the pack (the data passes through one buffer, so the
// frozen window pays a hash at ~20 GB/s and no second read) and checked before the content is
// used: by a rollback or an export before anything is written, and by Verify and Scrub. XXH3
// is not a cryptographic hash: packs are written by the daemon alone and the digest guards
// against damage (bit rot, a stray write, a truncated copy), not against a forger.

// DamageError says that a checkpoint's stored data is damaged: its content digest or its
// manifest no longer matches. It wraps errdefs.ErrDataLoss.
type DamageError struct {
	Checkpoint string
	Path       string // "" when the whole checkpoint (its manifest) is unreadable
	Reason     string
}

func (e *DamageError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("checkpoint %s is damaged: %s", e.Checkpoint, e.Reason)
	}
	return fmt.Sprintf("checkpoint %s is damaged: content of %q: %s", e.Checkpoint, e.Path, e.Reason)
}

// Unwrap makes a DamageError errdefs.ErrDataLoss.
func (e *DamageError) Unwrap() error { return errdefs.ErrDataLoss }

// Damage is one damaged checkpoint (and path) as Scrub and Damaged report it.
type Damage struct {
	Checkpoint string `json:"checkpoint"`
	Path       string `json:"path,omitempty"`
	Reason     string `json:"reason"`
}

func (d Damage) String() string {
	return (&DamageError{Checkpoint: d.Checkpoint, Path: d.Path, Reason: d.Reason}).Error()
}

// copier is a reusable copy buffer and hasher.
type copier struct {
	buf []byte
	h   *xxh3.Hasher
}

const copyBufSize = 256 << 10

var copiers = sync.Pool{New: func() any { return &copier{buf: make([]byte, copyBufSize), h: xxh3.New()} }}

// copyDigest copies size bytes from src at srcOff to dst at dstOff and returns their digest.
// A source shorter than size is an error.
func copyDigest(src int, srcOff int64, dst int, dstOff int64, size int64) (uint64, error) {
	c := copiers.Get().(*copier)
	defer copiers.Put(c)
	c.h.Reset()
	var done int64
	for done < size {
		chunk := c.buf[:min(int64(len(c.buf)), size-done)]
		if err := preadFull(src, chunk, srcOff+done); err != nil {
			return 0, fmt.Errorf("read: %w", err)
		}
		_, _ = c.h.Write(chunk)
		if err := pwriteFull(dst, chunk, dstOff+done); err != nil {
			return 0, fmt.Errorf("write pack: %w", err)
		}
		done += int64(len(chunk))
	}
	return c.h.Sum64(), nil
}

// digestRange returns the digest of size bytes of fd at off.
func digestRange(fd int, off, size int64) (uint64, error) {
	c := copiers.Get().(*copier)
	defer copiers.Put(c)
	c.h.Reset()
	for done := int64(0); done < size; {
		chunk := c.buf[:min(int64(len(c.buf)), size-done)]
		if err := preadFull(fd, chunk, off+done); err != nil {
			return 0, err
		}
		_, _ = c.h.Write(chunk)
		done += int64(len(chunk))
	}
	return c.h.Sum64(), nil
}

// pwriteFull writes all of buf at off.
func pwriteFull(fd int, buf []byte, off int64) error {
	for len(buf) > 0 {
		n, err := unix.Pwrite(fd, buf, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		buf, off = buf[n:], off+int64(n)
	}
	return nil
}

// checkContent verifies that e's content extent lies inside its pack f and, for entries
// that carry a digest, that the content still has it.
func checkContent(f *os.File, e *Entry) error {
	if err := checkExtent(f, e); err != nil {
		return err
	}
	if !e.summed {
		return nil
	}
	sum, err := digestRange(int(f.Fd()), e.Off, e.Size)
	if err != nil {
		return fmt.Errorf("read content of %q in checkpoint %s: %w", e.Path, e.ckpt, err)
	}
	return checkSum(e, sum)
}

// checkSum compares the digest of e's content as read with the recorded one (entries
// without a digest pass).
func checkSum(e *Entry, sum uint64) error {
	if e.summed && sum != e.Sum {
		return &DamageError{Checkpoint: e.ckpt, Path: e.Path,
			Reason: fmt.Sprintf("xxh3 %016x, recorded %016x", sum, e.Sum)}
	}
	return nil
}

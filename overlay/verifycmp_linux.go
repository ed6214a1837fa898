//go:build linux

package overlay

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// compare reports how the merged entry got differs from the recorded entry want (either may
// be nil), reading contents only when everything else about two files matches.
func (vw *verifier) compare(p string, want, got *Entry, dirfd int, name string, id fileID) error {
	switch {
	case want == nil && got == nil:
		return nil
	case got == nil:
		vw.add(p, "missing", string(want.Kind), "")
		return nil
	case want == nil:
		vw.add(p, "extra", "", string(got.Kind))
		return nil
	case want.Kind != got.Kind:
		vw.add(p, "type", string(want.Kind), string(got.Kind))
		return nil
	}
	vw.attrs(p, want, got)
	if want.Link != "" {
		vw.links[want.Link] = append(vw.links[want.Link], linkSeen{path: p, ino: id.ino})
	}
	if want.Kind != KindFile || want.Size != got.Size || want.Size == 0 {
		return nil
	}
	return vw.content(p, want, dirfd, name, id)
}

// attrs compares everything but contents of two entries of the same kind.
func (vw *verifier) attrs(p string, want, got *Entry) {
	if want.Kind != KindSymlink && want.Mode != got.Mode {
		vw.add(p, "mode", fmt.Sprintf("%04o", want.Mode), fmt.Sprintf("%04o", got.Mode))
	}
	if want.UID != got.UID || want.GID != got.GID {
		vw.add(p, "owner", fmt.Sprintf("%d:%d", want.UID, want.GID), fmt.Sprintf("%d:%d", got.UID, got.GID))
	}
	if want.Size != got.Size {
		vw.add(p, "size", strconv.FormatInt(want.Size, 10), strconv.FormatInt(got.Size, 10))
	}
	if want.Target != got.Target {
		vw.add(p, "target", want.Target, got.Target)
	}
	if want.Rdev != got.Rdev {
		vw.add(p, "rdev", devString(want.Rdev), devString(got.Rdev))
	}
	if !sameXattrs(want.Xattrs, got.Xattrs) {
		vw.add(p, "xattrs", xattrList(want.Xattrs), xattrList(got.Xattrs))
	}
	if vw.mtime && want.Mtime != got.Mtime {
		vw.add(p, "mtime", nsString(want.Mtime), nsString(got.Mtime))
	}
}

func devString(d uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(d), unix.Minor(d))
}

func nsString(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// xattrList renders xattrs as sorted name=quoted-value pairs.
func xattrList(x map[string][]byte) string {
	parts := make([]string, 0, len(x))
	for k, v := range x {
		parts = append(parts, k+"="+strconv.Quote(string(v)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// content compares a file's recorded content with the merged file name in dirfd, which must
// still be the regular file id the walk's stat saw (see openExpected).
func (vw *verifier) content(p string, want *Entry, dirfd int, name string, id fileID) error {
	src, err := openSource(vw.s, vw.v, want)
	var damage *DamageError
	if errors.As(err, &damage) {
		vw.add(p, "damaged", "checkpoint "+damage.Checkpoint+" intact", damage.Reason)
		return nil
	}
	if err != nil {
		return err
	}
	if src.owned {
		defer unix.Close(src.fd)
	}
	fd, err := openExpected(dirfd, name, id)
	if errors.Is(err, errReplaced) {
		vw.add(p, "type", string(KindFile), "changed during verify")
		return nil
	}
	if err != nil {
		return fmt.Errorf("open merged %q: %w", p, err)
	}
	defer unix.Close(fd)
	same, err := vw.sameRange(src.fd, src.off, fd, 0, want.Size)
	if err != nil || same {
		return err
	}
	vw.add(p, "content", hashRange(src.fd, src.off, want.Size), hashRange(fd, 0, want.Size))
	return nil
}

// sameRange compares size bytes of two files at the given offsets, reading into the
// verifier's two buffers.
func (vw *verifier) sameRange(a int, aoff int64, b int, boff int64, size int64) (bool, error) {
	if vw.bufA == nil {
		vw.bufA, vw.bufB = make([]byte, 64<<10), make([]byte, 64<<10)
	}
	for done := int64(0); done < size; {
		n := int(min(int64(len(vw.bufA)), size-done))
		if err := preadFull(a, vw.bufA[:n], aoff+done); err != nil {
			return false, fmt.Errorf("read recorded content: %w", err)
		}
		err := preadFull(b, vw.bufB[:n], boff+done)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil // the file shrank since the stat
		}
		if err != nil {
			return false, fmt.Errorf("read merged content: %w", err)
		}
		if !bytes.Equal(vw.bufA[:n], vw.bufB[:n]) {
			return false, nil
		}
		done += int64(n)
	}
	return true, nil
}

// preadFull fills buf from fd at off (io.ErrUnexpectedEOF if the file ends first).
func preadFull(fd int, buf []byte, off int64) error {
	for len(buf) > 0 {
		n, err := fdReaderAt(fd).ReadAt(buf, off)
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		buf, off = buf[n:], off+int64(n)
	}
	return nil
}

// hashRange returns the sha256 (hex) of size bytes of fd from off, or the read error.
func hashRange(fd int, off, size int64) string {
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(fdReaderAt(fd), off, size))
	if err != nil {
		return "read error: " + err.Error()
	}
	if n < size {
		return fmt.Sprintf("short read (%d of %d bytes)", n, size)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// fdReaderAt reads a raw fd with pread.
type fdReaderAt int

func (fd fdReaderAt) ReadAt(p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(int(fd), p, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// checkLinks reports every path of a recorded hard-link group whose paths no longer share
// one inode; Got lists the group's paths that share this path's inode.
func (vw *verifier) checkLinks() {
	for _, seen := range vw.links {
		byIno := map[uint64][]string{}
		var all []string
		for _, ls := range seen {
			byIno[ls.ino] = append(byIno[ls.ino], ls.path)
			all = append(all, ls.path)
		}
		if len(byIno) < 2 {
			continue
		}
		sort.Strings(all)
		for _, ls := range seen {
			peers := byIno[ls.ino]
			sort.Strings(peers)
			vw.add(ls.path, "link", "one inode: "+strings.Join(all, " "), "one inode: "+strings.Join(peers, " "))
		}
	}
}

package rootfs

import (
	"fmt"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// maxSymlinks bounds the symlinks Resolve follows for one path (the kernel's limit is 40).
const maxSymlinks = 40

// Resolve returns rel with its symlinks replaced by what they point to, resolved inside the
// root as if it were "/" (the semantics of openat2's RESOLVE_IN_ROOT: an absolute target
// starts again at the root, ".." stops at it), so that a sandbox's own symlinks work for
// copies (Debian's /bin -> usr/bin) and none leads out. The last component is followed only
// when followLast is set. Components that do not exist are kept as they are.
//
// The answer is a path that had no symlinks when it was checked; callers go on resolving it
// with the package's no-follow rules, so a sandbox that swaps a component for a symlink in
// between makes the operation fail, never reach outside the root.
func (r *Root) Resolve(rel string, followLast bool) (string, error) {
	todo := components(rel)
	var done []string
	links, missing := 0, false
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch {
		case c == "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		case missing || (len(todo) == 0 && !followLast):
			done = append(done, c)
			continue
		}
		cur := path.Join(append(done, c)...)
		st, err := r.Lstat(cur)
		if errdefs.IsNotFound(err) {
			missing = true
			done = append(done, c)
			continue
		}
		if err != nil {
			return "", err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			done = append(done, c)
			continue
		}
		if links++; links > maxSymlinks {
			return "", fmt.Errorf("/%s: more than %d symlinks: %w", rel, maxSymlinks, errdefs.ErrInvalidArgument)
		}
		target, err := r.Readlink(cur)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = nil
		}
		todo = append(components(target), todo...)
	}
	return path.Join(done...), nil
}

// components splits a path into its names, without empty ones and ".".
func components(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

//go:build linux

package overlay

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRandomizedRollback drives random file operations through the merged mount, takes
// checkpoints at random points (recording a full walk of the merged tree), and rolls back to
// random earlier checkpoints; the tree must then equal the recorded walk exactly (type, mode,
// owner, size, content hash, symlink target, xattrs, hard-link grouping, mtime), and Verify
// must report nothing right after each checkpoint and rollback. It also
// reopens the store and deletes checkpoints along the way. DELTABOX_OVERLAY_RANDOM_OPS and
// DELTABOX_OVERLAY_RANDOM_SEED run it longer or differently.
func TestRandomizedRollback(t *testing.T) {
	ops, seed := envInt("DELTABOX_OVERLAY_RANDOM_OPS", 400), envInt("DELTABOX_OVERLAY_RANDOM_SEED", 1)
	f := newFixture(t, standardLower)
	r := &randomizer{t: t, f: f, rng: rand.New(rand.NewPCG(uint64(seed), 7)), walks: map[string]map[string]nodeInfo{}}
	tracked, walked := scanCounts.tracked.Load(), scanCounts.walked.Load()
	r.checkpoint(L1)
	for i := 0; i < ops; i++ {
		r.step(i)
	}
	ids := f.s.Checkpoints()
	r.rollback(ids[r.rng.IntN(len(ids))])
	tracked, walked = scanCounts.tracked.Load()-tracked, scanCounts.walked.Load()-walked
	t.Logf("seed %d: %d ops, %d checkpoints, %d rollbacks (%d to another branch), %d reopens, %d deletes; scans: %d tracked (each checked against a walk), %d walked",
		seed, ops, r.n, r.rollbacks, r.cross, r.reopens, r.deletes, tracked, walked)
	if r.cross == 0 {
		t.Errorf("no rollback went to another branch of the tree")
	}
	if tracked < walked {
		t.Errorf("only %d of %d scans used the change tracker", tracked, tracked+walked)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type randomizer struct {
	t                              testing.TB
	f                              *fixture
	rng                            *rand.Rand
	walks                          map[string]map[string]nodeInfo
	n, rollbacks, reopens, deletes int
	cross                          int // rollbacks to a checkpoint that is not an ancestor of the head
}

func (r *randomizer) step(i int) {
	switch x := r.rng.Float64(); {
	case x < 0.08:
		lvl := L1
		if r.rng.IntN(5) == 0 {
			lvl = L2
		}
		r.checkpoint(lvl)
	case x < 0.11:
		ids := r.f.s.Checkpoints()
		r.rollback(ids[r.rng.IntN(len(ids))])
	case x < 0.125:
		r.f.reopen(r.t)
		r.reopens++
		if os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE") != "" {
			r.t.Logf("reopen")
		}
	case x < 0.14:
		r.deleteOne()
	default:
		r.mutate(i)
	}
}

func (r *randomizer) checkpoint(lvl Level) {
	id := fmt.Sprintf("c%03d", r.n)
	r.n++
	res := r.f.capture(r.t, id, lvl)
	if os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE") != "" {
		r.t.Logf("checkpoint %s %s: %v", id, lvl, res.Paths)
	}
	r.walks[id] = walkTree(r.t, r.f.merged)
	verifyNone(r.t, r.f, id, VerifyMtimes())
}

func (r *randomizer) rollback(id string) {
	r.t.Helper()
	r.rollbacks++
	if !isAncestor(r.t, r.f.s, id, r.f.s.Head()) {
		r.cross++
	}
	if tr := os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE"); tr != "" {
		r.t.Logf("before rollback to %s: %s", id, debugChain(r.f.s, tr))
	}
	res := r.f.rollback(r.t, id)
	if os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE") != "" {
		r.t.Logf("rollback to %s restored %v", id, res.Paths)
	}
	if d := diffTrees(r.walks[id], walkTree(r.t, r.f.merged), true); len(d) > 0 {
		if len(d) > 20 {
			d = d[:20]
		}
		r.t.Fatalf("after rollback to %s (rollback #%d):\n%s", id, r.rollbacks, joinLines(d))
	}
	verifyNone(r.t, r.f, id, VerifyMtimes())
}

func (r *randomizer) deleteOne() {
	ids := r.f.s.Checkpoints()
	if len(ids) < 3 {
		return
	}
	id := ids[r.rng.IntN(len(ids))]
	if id == r.f.s.Head() || len(r.f.s.Children(id)) > 1 {
		return // the head and branch points stay (Delete refuses them)
	}
	must(r.t, r.f.s.Delete(r.t.Context(), id))
	if os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE") != "" {
		r.t.Logf("deleted %s", id)
	}
	delete(r.walks, id)
	r.deletes++
}

// isAncestor reports whether a is b or one of b's ancestors.
func isAncestor(t testing.TB, s *Store, a, b string) bool {
	for b != "" {
		if a == b {
			return true
		}
		var err error
		if b, err = s.Parent(b); err != nil {
			t.Fatal(err)
		}
	}
	return false
}

func joinLines(lines []string) string {
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

// entries lists the merged tree's paths by type.
func (r *randomizer) entries() (files, dirs, all []string) {
	dirs = []string{""}
	err := filepath.Walk(r.f.merged, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(r.f.merged, p)
		if rel == "." {
			return nil
		}
		all = append(all, rel)
		switch {
		case fi.IsDir():
			dirs = append(dirs, rel)
		case fi.Mode().IsRegular():
			files = append(files, rel)
		}
		return nil
	})
	must(r.t, err)
	sort.Strings(files)
	sort.Strings(dirs)
	sort.Strings(all)
	return files, dirs, all
}

func (r *randomizer) pick(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return list[r.rng.IntN(len(list))]
}

func (r *randomizer) content() []byte {
	b := make([]byte, r.rng.IntN(3*4096))
	for i := range b {
		b[i] = byte(r.rng.IntN(256))
	}
	return b
}

// mutate performs one random operation; operations the kernel refuses (renaming a lower
// directory without redirect_dir, linking a directory, ...) are simply skipped.
func (r *randomizer) mutate(i int) {
	files, dirs, all := r.entries()
	newPath := r.f.m(filepath.Join(r.pick(dirs), fmt.Sprintf("n%d", i)))
	file, dir, any := r.pick(files), r.pick(dirs[1:]), r.pick(all)
	m := r.f.m
	op := r.rng.IntN(16)
	if os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE") != "" {
		r.t.Logf("op %d kind %d new=%s file=%s dir=%s any=%s", i, op, newPath, file, dir, any)
	}
	switch op {
	case 0:
		_ = os.WriteFile(newPath, r.content(), 0o644)
	case 1:
		if file != "" {
			_ = os.WriteFile(m(file), r.content(), 0o644)
		}
	case 2:
		if fh, err := os.OpenFile(m(file), os.O_APPEND|os.O_WRONLY|unix.O_NOFOLLOW, 0); err == nil {
			_, _ = fh.Write(r.content())
			fh.Close()
		}
	case 3:
		if notSymlink(m(file)) {
			_ = os.Truncate(m(file), int64(r.rng.IntN(5000)))
		}
	case 4:
		// Never follow a symlink the "sandbox" made: it may point at the host's / or /etc.
		if notSymlink(m(any)) {
			_ = unix.Fchmodat(unix.AT_FDCWD, m(any), []uint32{0o600, 0o644, 0o755, 0o700, 0o4755}[r.rng.IntN(5)], 0)
		}
	case 5:
		ids := []int{0, 1000, 1234}
		_ = os.Lchown(m(any), ids[r.rng.IntN(3)], ids[r.rng.IntN(3)])
	case 6:
		_ = os.Rename(m(any), newPath)
	case 7:
		_ = os.Link(m(file), newPath)
	case 8:
		_ = os.Symlink([]string{"/etc", "../data", "missing", "/"}[r.rng.IntN(4)], newPath)
	case 9:
		_ = os.Mkdir(newPath, 0o755)
	case 10:
		if dir != "" {
			_ = os.RemoveAll(m(dir))
		}
	case 11:
		if any != "" {
			_ = os.Remove(m(any))
		}
	case 12:
		target := r.pick(append(files, dirs[1:]...))
		if target != "" {
			_ = unix.Lsetxattr(m(target), fmt.Sprintf("user.k%d", r.rng.IntN(3)), r.xattrValue(), 0)
		}
	case 13:
		ts := unix.NsecToTimespec(time.Unix(int64(r.rng.IntN(1<<30)), int64(r.rng.IntN(1e9))).UnixNano())
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, m(any), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	case 14:
		if target := r.pick(files); target != "" {
			_ = unix.Lremovexattr(m(target), fmt.Sprintf("user.k%d", r.rng.IntN(3)))
		}
	case 15: // the root directory itself
		switch r.rng.IntN(3) {
		case 0:
			_ = os.Chmod(r.f.merged, []os.FileMode{0o755, 0o700, 0o711}[r.rng.IntN(3)])
		case 1:
			_ = os.Lchown(r.f.merged, []int{0, 1000}[r.rng.IntN(2)], 0)
		default:
			_ = unix.Lsetxattr(r.f.merged, "user.root", r.xattrValue(), 0)
		}
	}
}

// notSymlink reports whether p exists and is not a symlink, so the random operations never
// act on the host through a symlink the test made (targets include "/" and "/etc").
func notSymlink(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode()&os.ModeSymlink == 0
}

// xattrValue returns a short random value (0-19 bytes).
func (r *randomizer) xattrValue() []byte {
	b := make([]byte, r.rng.IntN(20))
	for i := range b {
		b[i] = byte(r.rng.IntN(256))
	}
	return b
}

package pool

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestIDRanges: ranges are distinct, the lowest free one is reused after a release, a range
// found at start is never handed out again, and a claim of a range another container holds is
// refused.
func TestIDRanges(t *testing.T) {
	a := newIDRanges("")
	if err := a.claim("old", IDMapping{HostID: IDRangeFirst + IDRangeSize, Size: IDRangeSize}); err != nil {
		t.Fatal(err)
	}
	m1, _ := a.allocate("c1")
	m2, _ := a.allocate("c2")
	if m1.HostID != IDRangeFirst || m2.HostID != IDRangeFirst+2*IDRangeSize || m1.Size != IDRangeSize {
		t.Fatalf("allocated %v and %v around a claimed range", m1, m2)
	}
	a.release("c1")
	if m3, _ := a.allocate("c3"); m3.HostID != IDRangeFirst {
		t.Fatalf("after a release: %v", m3)
	}
	if err := a.claim("intruder", m2); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("claim of c2's range by another container: %v", err)
	}
	for i := len(a.used); i < idRangeSlots; i++ {
		if _, err := a.allocate("x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.allocate("one-too-many"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("past the last range: %v", err)
	}
}

// TestMappingOfSpec: a spec without a user namespace has no mapping, whatever its id maps say.
func TestMappingOfSpec(t *testing.T) {
	maps := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 5 << 20, Size: 65536}}
	with := &specs.Spec{Linux: &specs.Linux{UIDMappings: maps, Namespaces: []specs.LinuxNamespace{{Type: specs.UserNamespace, Path: "/x"}}}}
	if m := mappingOfSpec(with); m == nil || m.HostID != 5<<20 || m.Size != 65536 {
		t.Fatalf("mapping %v", m)
	}
	without := &specs.Spec{Linux: &specs.Linux{UIDMappings: maps}}
	if m := mappingOfSpec(without); m != nil {
		t.Fatalf("no user namespace, but mapping %v", m)
	}
	if mappingOfSpec(nil) != nil || mappingOfSpec(&specs.Spec{}) != nil {
		t.Fatal("empty specs have mappings")
	}
}

// TestIDRangesAcrossDaemons: two daemons (two idRanges with different state roots) sharing
// the host's registry never hand out the same range; a range whose holder's directory is gone
// is taken over; a daemon's restart claims its ranges again and prunes the ones of sandboxes
// that vanished while it was down; a claim of another daemon's range is refused.
func TestIDRangesAcrossDaemons(t *testing.T) {
	reg := t.TempDir()
	rootA, rootB := t.TempDir(), t.TempDir()
	sandbox := func(root, cid string) string {
		d := filepath.Join(root, cid)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := newIDRanges(reg), newIDRanges(reg)
	a1, b1 := sandbox(rootA, "a1"), sandbox(rootB, "b1")
	ma, err := a.allocate(a1)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := b.allocate(b1)
	if err != nil {
		t.Fatal(err)
	}
	if ma.HostID == mb.HostID {
		t.Fatalf("two daemons got the same range %v", ma)
	}
	if err := b.claim(sandbox(rootB, "intruder"), ma); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("claim of the other daemon's range: %v", err)
	}
	// a1's sandbox directory vanishes behind the daemon's back (its daemon died): stale.
	if err := os.RemoveAll(a1); err != nil {
		t.Fatal(err)
	}
	if m, err := b.allocate(sandbox(rootB, "b2")); err != nil || m.HostID != ma.HostID {
		t.Fatalf("stale range not taken over: %v %v", m, err)
	}
	// Daemon A restarts: a2 is found (claimed again), a3's container is gone but its
	// directory and registry entry were left: pruned.
	a2, a3 := sandbox(rootA, "a2"), sandbox(rootA, "a3")
	m2, _ := a.allocate(a2)
	m3, _ := a.allocate(a3)
	restarted := newIDRanges(reg)
	if err := restarted.claim(a2, m2); err != nil {
		t.Fatal(err)
	}
	if err := restarted.prune(rootA); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(reg, fmtStart(m3))); !os.IsNotExist(err) {
		t.Fatalf("entry of the vanished sandbox a3 kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(reg, fmtStart(m2))); err != nil {
		t.Fatalf("entry of the claimed sandbox a2: %v", err)
	}
	restarted.release(a2)
	if _, err := os.Stat(filepath.Join(reg, fmtStart(m2))); !os.IsNotExist(err) {
		t.Fatalf("entry of the released sandbox a2 kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(reg, fmtStart(mb))); err != nil {
		t.Fatalf("the other daemon's entry was touched: %v", err)
	}
}

func fmtStart(m IDMapping) string { return fmt.Sprint(m.HostID) }

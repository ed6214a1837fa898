package pool

import (
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestIDRanges: ranges are distinct, the lowest free one is reused after a release, a range
// found at start is never handed out again, and a claim of a range another container holds is
// refused.
func TestIDRanges(t *testing.T) {
	a := newIDRanges()
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

//go:build linux

package criu

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// testIDs are host id ranges of the user-namespaced test sandboxes: above the pool's slots
// (pool.IDRangeFirst + 4096 ranges), so no daemon on this host hands them out.
var testIDs = []specs.LinuxIDMapping{
	{ContainerID: 0, HostID: 1<<29 + 7*65536, Size: 65536},
	{ContainerID: 0, HostID: 1<<29 + 8*65536, Size: 65536},
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newUserNSSandbox starts a counter sandbox in user namespace ids the way the pool does: runc
// makes the user namespace and, inside it, the network namespace, to which a veth is added
// from the host once the task exists.
func (e *env) newUserNSSandbox(t testing.TB, ids specs.LinuxIDMapping, cfg Options) *sandbox {
	t.Helper()
	sb := e.newContainerIn(t, busyboxImage, counterScript, cfg, &ids)
	task, err := sb.ctr.NewTask(e.ctx, cio.LogFile(filepath.Join(sb.dir, "task.log")))
	if err != nil {
		t.Fatalf("new task: %v", err)
	}
	sb.task = task
	host := "vt" + sb.id[len(sb.id)-8:]
	run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", fmt.Sprintf("/proc/%d/ns/net", task.Pid()))
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	ns := fmt.Sprint(task.Pid())
	run(t, "nsenter", "-t", ns, "-n", "ip", "link", "set", "eth0", "up")
	if err := task.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.waitInit(t, sb)
	sb.waitCount(t, "counter", func(n int) bool { return n > 3 })
	return sb
}

func uidMap(t testing.TB, sb *sandbox) string {
	return strings.Join(strings.Fields(run(t, "cat", fmt.Sprintf("/proc/%d/uid_map", sb.task.Pid()))), " ")
}

// TestUserNSDumpRestoreInPlace: a sandbox in its own user namespace (with a veth in its
// network namespace, whose peer is on the host) is dumped and restored in place: it counts on
// from the dumped value, as the same host ids, and its network namespace comes back without
// the veth (the caller attaches it again).
func TestUserNSDumpRestoreInPlace(t *testing.T) {
	e := newEnv(t)
	sb := e.newUserNSSandbox(t, testIDs[0], Options{TCPEstablished: true})
	before := uidMap(t, sb)
	parent := t.TempDir()
	if err := os.Chmod(parent, 0o700); err != nil { // CRIU gets the images directory as a descriptor
		t.Fatal(err)
	}
	images := filepath.Join(parent, "images")
	if _, err := e.cp.Dump(e.ctx, sb.id, images); err != nil {
		t.Fatalf("dump: %v", err)
	}
	dumped := sb.count()
	e.kill(t, sb)
	took := e.restore(t, sb, images)
	sb.waitCount(t, "restored counter", func(n int) bool { return n >= dumped && n <= dumped+10 })
	if after := uidMap(t, sb); after != before {
		t.Fatalf("uid_map after the restore %q, before %q", after, before)
	}
	links := run(t, "nsenter", "-t", fmt.Sprint(sb.task.Pid()), "-n", "ip", "-br", "link")
	if strings.Contains(links, "eth0") {
		t.Fatalf("the restored network namespace has the veth: %s", links)
	}
	e.waitInit(t, sb)
	t.Logf("restore in place %s, uid_map %s", took, before)
}

// TestUserNSRestoreIntoAnotherRange: images dumped in one id range are moved into another
// (RemapUserNS) and restored into a second container of that range, whose files were shifted
// likewise: the processes run as the second range's host ids, never the first's.
func TestUserNSRestoreIntoAnotherRange(t *testing.T) {
	e := newEnv(t)
	src := e.newUserNSSandbox(t, testIDs[0], Options{TCPEstablished: true})
	dst := e.newContainerIn(t, busyboxImage, counterScript, Options{TCPClose: true}, &testIDs[1])
	if err := src.task.Pause(e.ctx); err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(t.TempDir(), "images")
	if _, err := e.cp.Dump(e.ctx, src.id, images); err != nil {
		t.Fatal(err)
	}
	dumped := src.count()
	copyTree(t, e.upperDir(t, src.id), e.upperDir(t, dst.id))
	shiftOwners(t, e.upperDir(t, dst.id), testIDs[0].HostID, testIDs[1].HostID)
	if err := src.task.Resume(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cp.Restore(e.ctx, dst.id, images, nil); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("restore of the first range's images into the second range: %v, want permission denied", err)
	}
	if err := RemapUserNS(images, testIDs[1]); err != nil {
		t.Fatal(err)
	}
	e.restore(t, dst, images)
	dst.waitCount(t, "restored counter to continue", func(n int) bool { return n > dumped })
	want := fmt.Sprintf("0 %d 65536", testIDs[1].HostID)
	if got := uidMap(t, dst); got != want {
		t.Fatalf("restored uid_map %q, want %q", got, want)
	}
	if got := uidMap(t, src); got != fmt.Sprintf("0 %d 65536", testIDs[0].HostID) {
		t.Fatalf("source uid_map %q", got)
	}
}

// shiftOwners moves the owners of dir's entries from one host range to another.
func shiftOwners(t testing.TB, dir string, from, to uint32) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Uid < from || st.Gid < from {
			return fmt.Errorf("%s owned by %d:%d, below the range %d", path, st.Uid, st.Gid, from)
		}
		return os.Lchown(path, int(st.Uid-from+to), int(st.Gid-from+to))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUserNSForgedImagesRefused: images whose user namespace is not the target's are refused
// before CRIU runs: a map widened to the whole host id space (root included), a map onto
// another range, no user namespace at all for a user-namespaced container (CRIU would keep
// the processes in the host's user namespace, as host root) and a user namespace for a
// container without one. RemapUserNS refuses to move a widened map.
func TestUserNSForgedImagesRefused(t *testing.T) {
	e := newEnv(t)
	sb := e.newUserNSSandbox(t, testIDs[0], Options{TCPEstablished: true})
	images := filepath.Join(t.TempDir(), "images")
	if _, err := e.cp.Dump(e.ctx, sb.id, images); err != nil {
		t.Fatal(err)
	}
	spec, err := sb.ctr.Spec(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckUserNS(images, spec); err != nil {
		t.Fatalf("the images as dumped: %v", err)
	}
	imgs, _ := userNSImages(images)
	if len(imgs) != 1 {
		t.Fatalf("userns images %v, want one", imgs)
	}
	orig, err := os.ReadFile(imgs[0])
	if err != nil {
		t.Fatal(err)
	}
	forge := func(first, lower, count uint32) {
		e, err := readUserNS(imgs[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range append(e.GetUidMap(), e.GetGidMap()...) {
			x.First, x.LowerFirst, x.Count = &first, &lower, &count
		}
		if err := writeUserNS(imgs[0], e); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string) {
		t.Helper()
		if err := CheckUserNS(images, spec); !errdefs.IsPermissionDenied(err) {
			t.Errorf("%s: %v, want permission denied", what, err)
		}
	}
	forge(0, 0, 4294967295)
	refused("a map of the whole host id space")
	if err := RemapUserNS(images, testIDs[1]); !errdefs.IsPermissionDenied(err) {
		t.Errorf("remap of a widened map: %v, want permission denied", err)
	}
	forge(0, testIDs[1].HostID, 65536)
	refused("a map onto another range")
	if err := os.Remove(imgs[0]); err != nil {
		t.Fatal(err)
	}
	refused("no user namespace")
	if err := os.WriteFile(imgs[0], orig, 0o600); err != nil {
		t.Fatal(err)
	}
	noUserNS := *spec
	linux := *spec.Linux
	linux.Namespaces = nil
	noUserNS.Linux = &linux
	if err := CheckUserNS(images, &noUserNS); !errdefs.IsPermissionDenied(err) {
		t.Errorf("user namespace images into a container without one: %v, want permission denied", err)
	}
	os.WriteFile(imgs[0], []byte("garbage"), 0o600)
	if err := CheckUserNS(images, spec); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a garbage userns image: %v, want invalid argument", err)
	}
}

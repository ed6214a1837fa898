package rootfs

import (
	"archive/tar"
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestIDMap: ids inside the range map both ways; outside it, host ids show as 65534 (as the
// kernel shows them) and sandbox ids are refused.
func TestIDMap(t *testing.T) {
	m := IDMap{HostID: 1 << 28, Size: 65536}
	if h, err := m.ToHost(0); err != nil || h != 1<<28 {
		t.Fatalf("ToHost(0) = %d, %v", h, err)
	}
	if _, err := m.ToHost(65536); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("ToHost(65536): %v", err)
	}
	if _, err := m.ToHost(-1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("ToHost(-1): %v", err)
	}
	for host, want := range map[uint32]int{1 << 28: 0, 1<<28 + 1000: 1000, 0: 65534, 1<<28 + 65536: 65534, 1<<28 - 1: 65534} {
		if got := m.FromHost(host); got != want {
			t.Errorf("FromHost(%d) = %d, want %d", host, got, want)
		}
	}
	var none IDMap
	if h, _ := none.ToHost(7); h != 7 || none.FromHost(7) != 7 {
		t.Fatal("the zero map changes ids")
	}
}

// TestCopyMapsOwners: cp into a root with an id map writes the entries' owners shifted into the
// range (and the sandbox's root for entries it would not chown), refuses owners outside it,
// and cp out shows the ids the sandbox sees.
func TestCopyMapsOwners(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	m := IDMap{HostID: 1 << 28, Size: 65536}
	r, err := Open(dir, WithIDMap(m))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 0, Gid: 0},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 100, Size: 1},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	if _, err := r.Extract("/", tar.NewReader(bytes.NewReader(buf.Bytes())), ExtractOptions{Chown: true}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"d": 1 << 28, "d/f": 1<<28 + 1000} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil || st.Uid != want {
			t.Errorf("%s owned by %d (%v), want %d", p, st.Uid, err, want)
		}
	}
	var out bytes.Buffer
	if err := r.Archive("d", &out); err != nil {
		t.Fatal(err)
	}
	trd := tar.NewReader(&out)
	for {
		h, err := trd.Next()
		if err != nil {
			break
		}
		if want := map[string]int{"d": 0, "d/f": 1000}[strings.TrimSuffix(h.Name, "/")]; h.Uid != want {
			t.Errorf("cp out shows %s owned by %d, want %d", h.Name, h.Uid, want)
		}
	}
	buf.Reset()
	tw = tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 70000})
	tw.Close()
	if _, err := r.Extract("/", tar.NewReader(&buf), ExtractOptions{Chown: true}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("owner outside the map: %v", err)
	}
}

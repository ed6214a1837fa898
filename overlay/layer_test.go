//go:build linux

package overlay

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

func TestExportImportRoundTrip(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	applyEveryChangeKind(t, f)
	must(t, os.Remove(f.m("new/fifo"))) // fifos survive too, but keep the comparison simple
	must(t, unix.Lsetxattr(f.m("new/file.txt"), "user.round", []byte("trip"), 0))
	f.capture(t, "c1", L1)
	want := walkTree(t, f.merged)

	var buf bytes.Buffer
	must(t, f.s.Export(t.Context(), "c1", &buf))
	names := tarNames(t, buf.Bytes())
	for _, n := range []string{"data/.wh.b.txt", "etc/conf/.wh..wh..opq", "new/file.txt", "new/link"} {
		if !names[n] {
			t.Errorf("layer lacks %s (has %v)", n, names)
		}
	}

	// Applying the layer to a plain copy of the image gives the merged tree.
	dir := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", f.lower, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	must(t, Import(t.Context(), bytes.NewReader(buf.Bytes()), dir))
	got := walkTree(t, dir)
	// Mtimes keep their nanoseconds (PAX mtime records); directory mtimes are not compared,
	// and containerd's Apply deliberately never sets trusted.* xattrs from a tar.
	for p, w := range want {
		w.Xattrs = dropTrusted(w.Xattrs)
		want[p] = w
	}
	for p, n := range got {
		w, ok := want[p]
		if !ok {
			continue
		}
		if n.Type == "d---------" {
			n.Mtime, w.Mtime = 0, 0
		}
		got[p], want[p] = n, w
	}
	assertTree(t, want, got, true)

	// Applying it as an upper dir writes overlay whiteouts and the opaque flag.
	upper := t.TempDir()
	must(t, Import(t.Context(), bytes.NewReader(buf.Bytes()), upper, WithOverlayWhiteouts()))
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(upper, "data/b.txt"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("data/b.txt is not a whiteout: mode %o rdev %d", st.Mode, st.Rdev)
	}
	if v, err := getXattr(filepath.Join(upper, "etc/conf"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Fatalf("etc/conf not opaque: %q %v", v, err)
	}
	// The live upper dir is refused.
	if err := Import(t.Context(), bytes.NewReader(buf.Bytes()), f.upper, WithOverlayWhiteouts()); err == nil {
		t.Fatal("import into a mounted upper dir succeeded")
	}
}

func tarNames(t *testing.T, data []byte) map[string]bool {
	tr := tar.NewReader(bytes.NewReader(data))
	names := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names[strings.TrimSuffix(hdr.Name, "/")] = true
	}
	return names
}

func TestImportRejectsHostileEntries(t *testing.T) {
	outside := t.TempDir()
	canary := filepath.Join(outside, "canary")
	must(t, os.WriteFile(canary, []byte("safe"), 0o644))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		must(t, tw.WriteHeader(h))
		_, err := tw.Write([]byte(body))
		must(t, err)
	}
	rel, _ := filepath.Rel("/", outside)
	add(&tar.Header{Name: "../../../../../../../.." + outside + "/dotdot", Typeflag: tar.TypeReg}, "x")
	add(&tar.Header{Name: outside + "/absolute", Typeflag: tar.TypeReg}, "x")
	add(&tar.Header{Name: "escape", Typeflag: tar.TypeSymlink, Linkname: outside}, "")
	add(&tar.Header{Name: "escape/canary", Typeflag: tar.TypeReg}, "overwritten")
	add(&tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../" + rel}, "")
	add(&tar.Header{Name: "up/viaup", Typeflag: tar.TypeReg}, "x")
	add(&tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../../../../../../" + rel + "/canary"}, "")
	must(t, tw.Close())

	dir := t.TempDir()
	_ = Import(t.Context(), &buf, dir) // may fail on the hostile entries; must never escape
	data, err := os.ReadFile(canary)
	must(t, err)
	entries, err := os.ReadDir(outside)
	must(t, err)
	if string(data) != "safe" || len(entries) != 1 {
		t.Fatalf("import escaped its root: canary %q, %d entries outside", data, len(entries))
	}
}

func dropTrusted(x string) string {
	var keep []string
	for _, part := range strings.Split(x, ",") {
		if part != "" && !strings.HasPrefix(part, "trusted.") {
			keep = append(keep, part)
		}
	}
	return strings.Join(keep, ",")
}

// TestImportMovesIDs: a tar holding the ids a sandbox sees is written into a user-namespaced
// sandbox's range (owners moved up by its host id), and an owner outside the range or a file
// capability is refused; Export's side turns host ids back into the sandbox's.
func TestImportMovesIDs(t *testing.T) {
	const host, size = 1<<29 + 9*65536, 65536
	layer := func(hdrs ...*tar.Header) *bytes.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if h.Mode == 0 {
				h.Mode = 0o644
			}
			must(t, tw.WriteHeader(h))
		}
		must(t, tw.Close())
		return bytes.NewReader(buf.Bytes())
	}
	dir := t.TempDir()
	must(t, Import(t.Context(), layer(
		&tar.Header{Name: "home/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "home/u", Typeflag: tar.TypeReg, Uid: 1000, Gid: 1000},
		&tar.Header{Name: "rootfile", Typeflag: tar.TypeReg},
	), dir, WithIDShift(host, size)))
	for name, want := range map[string]uint32{"home": host, "home/u": host + 1000, "rootfile": host} {
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(dir, name), &st))
		if st.Uid != want || st.Gid != want {
			t.Errorf("%s owned by %d:%d, want %d", name, st.Uid, st.Gid, want)
		}
	}
	for what, h := range map[string]*tar.Header{
		"an owner past the range": {Name: "big", Typeflag: tar.TypeReg, Uid: size},
		"a group past the range":  {Name: "biggid", Typeflag: tar.TypeReg, Gid: size + 5},
		"a file capability": {Name: "capped", Typeflag: tar.TypeReg, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}},
	} {
		err := Import(t.Context(), layer(h), dir, WithIDShift(host, size))
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", what, err)
		}
		if _, serr := os.Lstat(filepath.Join(dir, h.Name)); serr == nil {
			t.Errorf("%s: %s was written", what, h.Name)
		}
	}

	ids := idShift{host, size}
	h := &tar.Header{Uid: host + 7, Gid: host, Uname: "x", Format: tar.FormatPAX,
		PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "c", "SCHILY.xattr.user.k": "v"}}
	sandboxView(h, ids)
	if h.Uid != 7 || h.Gid != 0 || h.Uname != "" || h.PAXRecords["SCHILY.xattr.security.capability"] != "" || h.PAXRecords["SCHILY.xattr.user.k"] != "v" {
		t.Errorf("sandbox view of a header: %+v", h)
	}
	h = &tar.Header{Uid: 0, Gid: host + size}
	sandboxView(h, ids)
	if h.Uid != overflowID || h.Gid != overflowID {
		t.Errorf("host ids outside the range: %d:%d, want %d", h.Uid, h.Gid, overflowID)
	}
	h = &tar.Header{Uid: 5, Gid: 6}
	sandboxView(h, idShift{})
	if h.Uid != 5 || h.Gid != 6 {
		t.Errorf("no user namespace: %d:%d moved", h.Uid, h.Gid)
	}
}

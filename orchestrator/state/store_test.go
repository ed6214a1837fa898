package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

func TestGet(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	wantDoc(t, s, `{}`)
	patch(t, s, `[{"op":"add","path":"/a","value":{"b":[1,{"c~/":"x"}]}}]`)
	cases := []struct{ ptr, want, class string }{
		{"/a/b/0", `1`, ""},
		{"/a/b/1/c~0~1", `"x"`, ""},
		{"/a/missing", "", "not_found"},
		{"/a/b/5", "", "not_found"},
		{"/a/b/-", "", "not_found"},
		{"/a/b/01", "", "invalid_argument"},
		{"a", "", "invalid_argument"},
		{"/a~x", "", "invalid_argument"},
	}
	for _, c := range cases {
		got, err := s.Get(c.ptr)
		if classOf(err) != c.class || string(got) != c.want {
			t.Errorf("Get(%q) = %s, %v; want %s, class %q", c.ptr, got, err, c.want, c.class)
		}
	}
}

func TestParseOps(t *testing.T) {
	ops := mustOps(t, `{"op":"add","path":"/a","value":null}`)
	if len(ops) != 1 || string(ops[0].Value) != "null" {
		t.Fatalf("single op with null value: %+v", ops)
	}
	ops = mustOps(t, `[{"op":"copy","from":"","path":"/x"}]`)
	if got := mustJSON(t, ops[0]); got != `{"op":"copy","path":"/x","from":""}` {
		t.Fatalf("copy from the root marshals as %s", got)
	}
	_, err := ParseOps([]byte(`[{"op":"add","path":"/a","value":1},{"op":"add","path":"/b"}]`))
	var oe *OpError
	if !errors.As(err, &oe) || oe.Index != 1 || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"value"`) {
		t.Fatalf("missing value: err = %v, want an invalid-argument OpError for op 1 naming \"value\"", err)
	}
	for _, bad := range []string{``, `3`, `[1]`, `{"op":"add"}`, `[{"op":"move","path":"/a"}]`} {
		if _, err := ParseOps([]byte(bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseOps(%q) = %v, want invalid argument", bad, err)
		}
	}
}

func TestPatchAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	patch(t, s, `[{"op":"add","path":"/a","value":[1,2]}]`)
	before, size := getDoc(t, s), logSize(t, dir)
	_, err := s.Patch(context.Background(), mustOps(t, `[
		{"op":"add","path":"/a/-","value":3},
		{"op":"move","from":"/a/0","path":"/b"},
		{"op":"replace","path":"/a/9","value":0}]`), PatchOptions{})
	var oe *OpError
	if !errors.As(err, &oe) || oe.Index != 2 || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v, want invalid argument naming op 2", err)
	}
	if got := getDoc(t, s); got != before {
		t.Fatalf("document changed by a failed patch: %s, was %s", got, before)
	}
	if s.Seq() != 1 || logSize(t, dir) != size {
		t.Fatalf("failed patch moved seq to %d or grew the log", s.Seq())
	}
}

func logSize(t testing.TB, dir string) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, logName))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestInverses checks the logged inverse of each kind of op.
func TestInverses(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	patch(t, s, `[{"op":"add","path":"/o","value":{"k":"v"}},{"op":"add","path":"/a","value":[10,20,30]}]`)
	cases := []struct{ op, inverse string }{
		{`{"op":"replace","path":"/o/k","value":"w"}`, `[{"op":"replace","path":"/o/k","value":"v"}]`},
		{`{"op":"add","path":"/o/k","value":"x"}`, `[{"op":"replace","path":"/o/k","value":"w"}]`},
		{`{"op":"add","path":"/o/n","value":1}`, `[{"op":"remove","path":"/o/n"}]`},
		{`{"op":"add","path":"/a/-","value":40}`, `[{"op":"remove","path":"/a/3"}]`},
		{`{"op":"remove","path":"/a/0"}`, `[{"op":"add","path":"/a/0","value":10}]`},
		{`{"op":"move","from":"/a/0","path":"/a/-"}`, `[{"op":"move","path":"/a/0","from":"/a/2"}]`},
		{`{"op":"move","from":"/o/n","path":"/o/k"}`, `[{"op":"replace","path":"/o/k","value":"x"},{"op":"add","path":"/o/n","value":1}]`},
		{`{"op":"copy","from":"/a","path":"/c"}`, `[{"op":"remove","path":"/c"}]`},
		{`{"op":"test","path":"/c/0","value":30}`, `[]`},
		{`{"op":"append","path":"/c","value":5}`, `[{"op":"remove","path":"/c/3"}]`},
		{`{"op":"append","path":"/o/log","value":5}`, `[{"op":"remove","path":"/o/log"}]`},
	}
	for _, c := range cases {
		res := patch(t, s, c.op)
		log, err := s.Log(res.Seq-1, res.Seq)
		if err != nil || len(log) != 1 {
			t.Fatalf("Log after %s: %v, %v", c.op, log, err)
		}
		if got := mustJSON(t, log[0].Inverse); got != c.inverse {
			t.Errorf("inverse of %s = %s, want %s", c.op, got, c.inverse)
		}
	}
	if _, err := s.RollbackTo(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	wantDoc(t, s, `{"o":{"k":"v"},"a":[10,20,30]}`)
}

func TestPersistenceReplay(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	patch(t, s, `[{"op":"add","path":"/msgs","value":[]}]`)
	for i := range 20 {
		if _, err := s.Patch(context.Background(), mustOps(t, fmt.Sprintf(`{"op":"append","path":"/msgs","value":{"i":%d,"big":123456789012345678901234567890}}`, i)),
			PatchOptions{Checkpoint: fmt.Sprintf("ck-%d", i/5)}); err != nil {
			t.Fatal(err)
		}
	}
	doc, seq := getDoc(t, s), s.Seq()
	log1, _ := s.Log(0, seq)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	if getDoc(t, s) != doc || s.Seq() != seq {
		t.Fatalf("reopened: seq %d doc %s; want seq %d doc %s", s.Seq(), getDoc(t, s), seq, doc)
	}
	log2, _ := s.Log(0, seq)
	if mustJSON(t, log1) != mustJSON(t, log2) || len(log2) != 21 || log2[20].Checkpoint != "ck-3" {
		t.Fatalf("log differs after reopen:\n%s\n%s", mustJSON(t, log1), mustJSON(t, log2))
	}
	if err := s.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestTornWriteRecovery(t *testing.T) {
	for _, cut := range []int{1, 5, 9, 30} {
		t.Run(fmt.Sprintf("cut %d bytes", cut), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			patch(t, s, `{"op":"add","path":"/a","value":1}`)
			patch(t, s, `{"op":"add","path":"/b","value":2}`)
			good := logSize(t, dir)
			patch(t, s, `{"op":"add","path":"/c","value":"a long enough value to cut into"}`)
			s.Close()
			if err := os.Truncate(filepath.Join(dir, logName), logSize(t, dir)-int64(cut)); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir)
			defer s.Close()
			wantDoc(t, s, `{"a":1,"b":2}`)
			if s.Seq() != 2 || logSize(t, dir) != good {
				t.Fatalf("seq %d, log %d bytes; want 2 and %d", s.Seq(), logSize(t, dir), good)
			}
			patch(t, s, `{"op":"add","path":"/d","value":4}`)
			if err := s.Verify(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestZeroFilledTailAndCorruption(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	patch(t, s, `{"op":"add","path":"/a","value":1}`)
	patch(t, s, `{"op":"add","path":"/b","value":2}`)
	s.Close()
	path := filepath.Join(dir, logName)
	data, _ := os.ReadFile(path)
	if err := os.WriteFile(path, append(data, make([]byte, 64)...), 0o600); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	wantDoc(t, s, `{"a":1,"b":2}`)
	s.Close()
	data[frameHeader+3] ^= 0xff // damage the first record: not a torn tail
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), dir); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("Open of a log damaged in the middle = %v, want data loss", err)
	}
}

func TestGroupCommit(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	patch(t, s, `{"op":"add","path":"/l","value":[]}`)
	const workers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				op := fmt.Sprintf(`{"op":"append","path":"/l","value":"%d-%d"}`, w, i)
				if _, err := s.Patch(context.Background(), mustOps(t, op), PatchOptions{}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s.Seq() != workers*each+1 {
		t.Fatalf("seq = %d, want %d", s.Seq(), workers*each+1)
	}
	syncs := s.commit.syncs.Load()
	t.Logf("%d patches, %d fsyncs", workers*each, syncs)
	if syncs >= workers*each {
		t.Fatalf("%d fsyncs for %d concurrent patches: no group commit", syncs, workers*each)
	}
	doc := getDoc(t, s)
	s.Close()
	s = openStore(t, dir)
	defer s.Close()
	if getDoc(t, s) != doc {
		t.Fatal("document differs after reopen")
	}
}

func TestIfSeq(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	ctx := context.Background()
	seq := patch(t, s, `{"op":"add","path":"/a","value":1}`).Seq
	stale := seq - 1
	_, err := s.Patch(ctx, mustOps(t, `{"op":"add","path":"/a","value":2}`), PatchOptions{IfSeq: &stale})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("stale IfSeq: %v, want conflict", err)
	}
	wantDoc(t, s, `{"a":1}`)
	res, err := s.Patch(ctx, mustOps(t, `{"op":"add","path":"/a","value":2}`), PatchOptions{IfSeq: &seq})
	if err != nil || res.Seq != seq+1 || res.Applied != 1 {
		t.Fatalf("current IfSeq: %+v, %v", res, err)
	}
	if _, err := s.RollbackTo(ctx, seq); err != nil {
		t.Fatal(err)
	}
	// After rolling back to seq, the numbering moved on: an IfSeq read before is stale.
	if _, err = s.Patch(ctx, mustOps(t, `{"op":"add","path":"/a","value":3}`), PatchOptions{IfSeq: &seq}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("IfSeq from before a rollback: %v, want conflict", err)
	}
}

func TestLimits(t *testing.T) {
	s := openStore(t, t.TempDir(), WithMaxOpsPerPatch(3), WithMaxValueSize(100), WithMaxDocumentSize(250))
	defer s.Close()
	ctx := context.Background()
	patch(t, s, `{"op":"add","path":"/a","value":[]}`)
	big := fmt.Sprintf(`{"op":"append","path":"/a","value":"%s"}`, strings.Repeat("x", 90))
	cases := []struct{ name, ops, msg string }{
		{"ops", `[{"op":"test","path":"","value":{}},{"op":"test","path":"","value":{}},{"op":"test","path":"","value":{}},{"op":"test","path":"","value":{}}]`, "4 ops"},
		{"value", `{"op":"add","path":"/v","value":"` + strings.Repeat("y", 120) + `"}`, "limit of 100"},
		{"document", "[" + big + "," + big + "," + big + "]", "limit of 250"},
	}
	for _, c := range cases {
		_, err := s.Patch(ctx, mustOps(t, c.ops), PatchOptions{})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s limit: %v, want invalid argument mentioning %q", c.name, err, c.msg)
		}
	}
	wantDoc(t, s, `{"a":[]}`)
	patch(t, s, "["+big+","+big+"]") // under the limit
	if s.Seq() != 3 {
		t.Fatalf("seq = %d, want 3", s.Seq())
	}
}

func TestRollbackAndReopen(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir)
	patch(t, s, `[{"op":"add","path":"/plan","value":["a"]},{"op":"add","path":"/n","value":0}]`) // 1, 2
	ck := s.Seq()
	patch(t, s, `[{"op":"append","path":"/plan","value":"b"},{"op":"replace","path":"/n","value":1}]`) // 3, 4
	patch(t, s, `[{"op":"move","from":"/plan/0","path":"/plan/-"},{"op":"remove","path":"/n"}]`)       // 5, 6
	n, err := s.RollbackTo(ctx, ck)
	if err != nil || n != 4 {
		t.Fatalf("RollbackTo(%d) = %d, %v; want 4 undone", ck, n, err)
	}
	wantDoc(t, s, `{"plan":["a"],"n":0}`)
	if s.Seq() != 7 {
		t.Fatalf("seq after rollback = %d, want 7 (the marker)", s.Seq())
	}
	if log, _ := s.Log(0, 100); len(log) != 2 {
		t.Fatalf("Log after rollback has %d entries, want the 2 live ones", len(log))
	}
	if _, err := s.RollbackTo(ctx, 4); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("rollback to an undone seq: %v, want failed precondition", err)
	}
	if _, err := s.RollbackTo(ctx, 99); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("rollback to the future: %v, want invalid argument", err)
	}
	patch(t, s, `{"op":"add","path":"/x","value":true}`) // 8
	s.Close()
	s = openStore(t, dir)
	defer s.Close()
	wantDoc(t, s, `{"plan":["a"],"n":0,"x":true}`)
	if s.Seq() != 8 {
		t.Fatalf("seq after reopen = %d, want 8", s.Seq())
	}
	if n, err := s.RollbackTo(ctx, 7); err != nil || n != 1 {
		t.Fatalf("rollback to the marker: %d, %v", n, err)
	}
	if n, err := s.RollbackTo(ctx, 0); err != nil || n != 2 {
		t.Fatalf("rollback to 0: %d, %v", n, err)
	}
	wantDoc(t, s, `{}`)
	if err := s.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotBoundsReplay(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir, WithSnapshotEvery(10))
	for i := range 35 {
		patch(t, s, fmt.Sprintf(`{"op":"add","path":"/k%d","value":%d}`, i, i))
	}
	if _, err := s.RollbackTo(ctx, 30); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	doc := getDoc(t, s)
	s.Close()
	if seq, _, err := readSnapshot(dir); err != nil || seq != 36 {
		t.Fatalf("snapshot seq = %d, %v; want 36", seq, err)
	}
	r, err := rebuild(dir, DefaultMaxDepth)
	if err != nil || r.snapSeq != 36 {
		t.Fatalf("rebuild from snapshot: %v", err)
	}
	s = openStore(t, dir)
	defer s.Close()
	if getDoc(t, s) != doc {
		t.Fatal("document differs after reopen from snapshot")
	}
	// The history before the snapshot is still there for rollback and Log.
	if log, _ := s.Log(0, 5); len(log) != 5 {
		t.Fatalf("Log(0,5) after snapshot has %d entries", len(log))
	}
	if _, err := s.RollbackTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	wantDoc(t, s, `{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4}`)
	if err := s.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if tmp := tempFiles(dir); len(tmp) > 0 {
		t.Fatalf("temp files left behind: %v", tmp)
	}
}

func TestCompact(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir)
	for i := range 10 {
		patch(t, s, fmt.Sprintf(`{"op":"add","path":"/k%d","value":%d}`, i, i))
	}
	if _, err := s.RollbackTo(ctx, 8); err != nil { // 11
		t.Fatal(err)
	}
	patch(t, s, `{"op":"add","path":"/z","value":0}`) // 12
	if err := s.Compact(ctx, 9); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("compact to an undone seq: %v", err)
	}
	before := logSize(t, dir)
	if err := s.Compact(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if logSize(t, dir) >= before {
		t.Fatalf("compaction did not shrink the log: %d -> %d", before, logSize(t, dir))
	}
	if _, err := s.RollbackTo(ctx, 4); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("rollback below the compaction point: %v", err)
	}
	if _, err := s.Log(3, 12); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Log below the compaction point: %v", err)
	}
	patch(t, s, `{"op":"add","path":"/after","value":1}`) // 13
	doc := getDoc(t, s)
	s.Close()
	s = openStore(t, dir)
	defer s.Close()
	if getDoc(t, s) != doc || s.Seq() != 13 {
		t.Fatalf("after compaction and reopen: seq %d, %s; want 13, %s", s.Seq(), getDoc(t, s), doc)
	}
	if log, _ := s.Log(5, 13); len(log) != 5 { // 6, 7, 8, 12, 13
		t.Fatalf("Log(5,13) has %d entries, want 5", len(log))
	}
	if _, err := s.RollbackTo(ctx, 11); err != nil { // the kept marker is still a target
		t.Fatal(err)
	}
	if _, err := s.RollbackTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	wantDoc(t, s, `{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4}`)
	if err := s.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyNamesDifferences(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	patch(t, s, `{"op":"add","path":"/a","value":{"b":1,"c":[1,2]}}`)
	s.mu.Lock()
	s.doc.root.(map[string]any)["a"].(map[string]any)["b"] = json.Number("2")
	s.mu.Unlock()
	err := s.Verify(context.Background())
	if !errors.Is(err, errdefs.ErrDataLoss) || !strings.Contains(err.Error(), `"/a/b"`) || strings.Contains(err.Error(), `"/a/c"`) {
		t.Fatalf("Verify = %v, want data loss naming /a/b only", err)
	}
}

// failingLog wraps the real log and fails writes or syncs on demand.
type failingLog struct {
	logFile
	failWrite, failSync bool
}

func (f *failingLog) Write(p []byte) (int, error) {
	if f.failWrite {
		n, _ := f.logFile.Write(p[:len(p)/2]) // a partial write, which must be cut off
		return n, errors.New("injected write error")
	}
	return f.logFile.Write(p)
}

func (f *failingLog) Sync() error {
	if f.failSync {
		return errors.New("injected fsync error")
	}
	return f.logFile.Sync()
}

func inject(s *Store) *failingLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	fl := &failingLog{logFile: s.log}
	s.log = fl
	s.commit.swap(fl)
	return fl
}

func TestLogWriteFailureLeavesMemoryUnchanged(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir)
	patch(t, s, `[{"op":"add","path":"/a","value":[1]},{"op":"add","path":"/b","value":1}]`)
	fl := inject(s)
	fl.failWrite = true
	if _, err := s.Patch(ctx, mustOps(t, `[{"op":"append","path":"/a","value":2},{"op":"remove","path":"/b"}]`), PatchOptions{}); err == nil {
		t.Fatal("patch succeeded with a failing log")
	}
	wantDoc(t, s, `{"a":[1],"b":1}`)
	if _, err := s.RollbackTo(ctx, 0); err == nil {
		t.Fatal("rollback succeeded with a failing log")
	}
	wantDoc(t, s, `{"a":[1],"b":1}`)
	if s.Seq() != 2 {
		t.Fatalf("seq = %d, want 2", s.Seq())
	}
	fl.failWrite = false
	patch(t, s, `{"op":"add","path":"/c","value":3}`)
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify after a failed write: %v", err)
	}
	s.Close()
}

func TestFsyncFailureFailsStore(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	patch(t, s, `{"op":"add","path":"/a","value":1}`)
	inject(s).failSync = true
	if _, err := s.Patch(context.Background(), mustOps(t, `{"op":"add","path":"/b","value":2}`), PatchOptions{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("patch with a failing fsync: %v, want unavailable", err)
	}
	if _, err := s.Get(""); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Get on a failed store: %v, want unavailable", err)
	}
	s.Close()
	s = openStore(t, dir) // reopening serves what is on disk
	defer s.Close()
	if got := getDoc(t, s); got != `{"a":1}` && got != `{"a":1,"b":2}` {
		t.Fatalf("reopened document %s", got)
	}
}

func TestOpenTwiceAndClosed(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, err := Open(context.Background(), dir); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("second Open: %v, want unavailable", err)
	}
	s.Close()
	if _, err := s.Get(""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Get after Close: %v", err)
	}
	s = openStore(t, dir) // the lock is released
	s.Close()
}

func tempFiles(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestReplayRollbackAcrossSnapshot: a rollback logged after a snapshot undoes ops that only
// the snapshot holds; replay must undo them from the logged inverses.
func TestReplayRollbackAcrossSnapshot(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir, WithSnapshotEvery(0))
	for i := range 20 {
		patch(t, s, fmt.Sprintf(`{"op":"add","path":"/k%d","value":{"v":%d}}`, i%7, i))
	}
	if err := s.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RollbackTo(ctx, 10); err != nil {
		t.Fatal(err)
	}
	patch(t, s, `{"op":"add","path":"/after","value" :  [ 1, 2 ]}`)
	doc, log := getDoc(t, s), mustJSON(t, must(s.Log(0, 100)))
	s.Close()
	s = openStore(t, dir)
	defer s.Close()
	if got := getDoc(t, s); got != doc {
		t.Fatalf("after reopen: %s, want %s", got, doc)
	}
	if got := mustJSON(t, must(s.Log(0, 100))); got != log {
		t.Fatalf("log after reopen:\n%s\nwant\n%s", got, log)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

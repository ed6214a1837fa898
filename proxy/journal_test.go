package proxy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// frames returns the [start, end) offsets of the records of a journal file.
func frames(t *testing.T, data []byte) [][2]int {
	t.Helper()
	var out [][2]int
	for off := 0; off < len(data); {
		_, n, ok := decodeRecord(data[off:])
		if !ok {
			t.Fatalf("journal does not decode at %d", off)
		}
		out = append(out, [2]int{off, off + n})
		off += n
	}
	return out
}

// journalWithThree holds three effects of sb-a (seq 1-3), stops the proxy and returns the
// journal path, its bytes, the effect IDs and the upstream.
func journalWithThree(t *testing.T) (*testEnv, string, []byte, []string, *upstream) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	ids := []string{holdPOST(t, c, up.URL+"/one", "1"), holdPOST(t, c, up.URL+"/two", "2"), holdPOST(t, c, up.URL+"/three", "3")}
	e.close()
	path := filepath.Join(e.dir, "journal", "sb-a.journal")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(frames(t, data)); n != 3 {
		t.Fatalf("journal has %d records, want 3", n)
	}
	return e, path, data, ids, up
}

func effectIDs(effs []Effect) []string {
	var out []string
	for _, e := range effs {
		out = append(out, e.ID)
	}
	return out
}

// TestJournalCorruptionMatrix: each way a journal file can be bad, with its one outcome.
func TestJournalCorruptionMatrix(t *testing.T) {
	t.Run("torn tail is cut off and the rest commits", func(t *testing.T) {
		e, path, data, ids, up := journalWithThree(t)
		fr := frames(t, data)
		cut := fr[2][0] + (fr[2][1]-fr[2][0])/2
		_ = os.WriteFile(path, data[:cut], 0o600)
		e2 := newEnvAt(t, e.dir)
		if got := effectIDs(e2.p.Effects("sb-a")); len(got) != 2 || got[1] != ids[1] {
			t.Fatalf("effects %v", got)
		}
		if st, _ := os.Stat(path); st.Size() != int64(fr[2][0]) {
			t.Fatalf("journal is %d bytes, want the torn tail cut at %d", st.Size(), fr[2][0])
		}
		if err := e2.p.Damage("sb-a"); err != nil {
			t.Fatalf("a torn tail is not damage: %v", err)
		}
		if res, err := e2.p.Commit(e2.ctx, "sb-a"); err != nil || res.Released != 2 || len(up.seen()) != 2 {
			t.Fatalf("commit: %+v %v", res, err)
		}
	})
	t.Run("zero-filled last record is a torn tail", func(t *testing.T) {
		e, path, data, _, _ := journalWithThree(t)
		fr := frames(t, data)
		for i := fr[2][1] - 10; i < fr[2][1]; i++ {
			data[i] = 0
		}
		_ = os.WriteFile(path, data, 0o600)
		e2 := newEnvAt(t, e.dir)
		if n := len(e2.p.Effects("sb-a")); n != 2 || e2.p.Damage("sb-a") != nil {
			t.Fatalf("%d effects, damage %v", n, e2.p.Damage("sb-a"))
		}
	})
	for name, at := range map[string]func(fr [][2]int) int{
		"flipped byte in a middle record's payload": func(fr [][2]int) int { return fr[1][0] + frameHeader + 20 },
		"flipped byte in a middle record's length":  func(fr [][2]int) int { return fr[1][0] + 2 },
	} {
		t.Run(name+" keeps every effect and refuses commit", func(t *testing.T) {
			e, path, data, ids, up := journalWithThree(t)
			fr := frames(t, data)
			data[at(fr)] ^= 0x5a
			_ = os.WriteFile(path, data, 0o600)
			e2 := newEnvAt(t, e.dir)
			if got := effectIDs(e2.p.Effects("sb-a")); len(got) != 2 || got[0] != ids[0] || got[1] != ids[2] {
				t.Fatalf("effects %v, want the first and the third", got)
			}
			if effs := e2.p.Effects("sb-a"); !effs[0].Suspect || effs[1].Suspect {
				t.Fatalf("suspects %+v: want the effect recorded before the damage only", effs)
			}
			err := e2.p.Damage("sb-a")
			for _, want := range []string{"do not decode", "seq 2 are lost", ids[0] + " (seq 1, held)"} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("damage %v does not say %q", err, want)
				}
			}
			_, err = e2.p.Commit(e2.ctx, "sb-a")
			if !errdefs.IsDataLoss(err) || len(up.seen()) != 0 {
				t.Fatalf("commit of a damaged journal: %v, upstream %+v", err, up.seen())
			}
			if after, _ := os.ReadFile(path); len(after) != len(data) {
				t.Fatalf("damaged journal changed from %d to %d bytes", len(data), len(after))
			}
			e2.close()
			if newEnvAt(t, e.dir).p.Damage("sb-a") == nil {
				t.Fatal("damage forgotten after a restart")
			}
		})
	}
	t.Run("flipped byte in the last record is damage, not a torn tail", func(t *testing.T) {
		e, path, data, ids, _ := journalWithThree(t)
		fr := frames(t, data)
		data[fr[2][0]+frameHeader+30] ^= 0x01
		_ = os.WriteFile(path, data, 0o600)
		e2 := newEnvAt(t, e.dir)
		if n := len(e2.p.Effects("sb-a")); n != 2 {
			t.Fatalf("%d effects", n)
		}
		err := e2.p.Damage("sb-a")
		if err == nil || !strings.Contains(err.Error(), "do not decode") || !strings.Contains(err.Error(), ids[1]) {
			t.Fatalf("damage %v", err)
		}
		if _, err := e2.p.Commit(e2.ctx, "sb-a"); !errdefs.IsDataLoss(err) {
			t.Fatalf("commit: %v", err)
		}
		if st, _ := os.Stat(path); st.Size() != int64(len(data)) {
			t.Fatal("the damaged last record was cut off")
		}
	})
	t.Run("missing file is damage once a checkpoint expects effects", func(t *testing.T) {
		e, path, _, _, up := journalWithThree(t)
		_ = os.Remove(path)
		e2 := newEnvAt(t, e.dir)
		if err := e2.p.ExpectWatermark(e2.ctx, "sb-a", 0); err != nil {
			t.Fatalf("watermark 0 needs no journal: %v", err)
		}
		err := e2.p.ExpectWatermark(e2.ctx, "sb-a", 3)
		if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "up to seq 3") {
			t.Fatalf("ExpectWatermark: %v", err)
		}
		e2.register(2, "sb-a", basePolicy(up.hostPort()))
		holdPOST(t, e2.client(2), up.URL+"/four", "4")
		if effs := e2.p.Effects("sb-a"); len(effs) != 1 || effs[0].Seq != 4 {
			t.Fatalf("a new effect reused a lost sequence number: %+v", effs)
		}
		e2.close()
		e3 := newEnvAt(t, e.dir)
		err = e3.p.Damage("sb-a")
		if err == nil || !strings.Contains(err.Error(), "seq 1-3 are lost") {
			t.Fatalf("after restart: %v", err)
		}
		if _, err := e3.p.Commit(e3.ctx, "sb-a"); !errdefs.IsDataLoss(err) || len(up.seen()) != 0 {
			t.Fatalf("commit: %v", err)
		}
	})
}

// TestDamagedDropRecordIsNotResurrected: the record that dropped an effect is damaged; a
// later record is intact. Guessing "torn tail" would bring the dropped effect back as held.
func TestDamagedDropRecordIsNotResurrected(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	holdPOST(t, c, up.URL+"/keep", "k")
	wm := e.p.Watermark("sb-a")
	drop := holdPOST(t, c, up.URL+"/rolled-back", "d")
	if _, _, err := e.p.Rollback(e.ctx, "sb-a", wm); err != nil {
		t.Fatal(err)
	}
	holdPOST(t, c, up.URL+"/later", "l")
	e.close()
	path := filepath.Join(e.dir, "journal", "sb-a.journal")
	data, _ := os.ReadFile(path)
	fr := frames(t, data)
	data[fr[2][0]+frameHeader+5] ^= 0x20 // the "dropped" status record
	_ = os.WriteFile(path, data, 0o600)
	e2 := newEnvAt(t, e.dir)
	if _, err := e2.p.Commit(e2.ctx, "sb-a"); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), drop) {
		t.Fatalf("commit: %v", err)
	}
	if len(up.seen()) != 0 {
		t.Fatalf("upstream got %+v", up.seen())
	}
}

// failingFile fails writes after writing half, and truncates if allowed.
type failingFile struct {
	journalFile
	failWrite, failTruncate bool
}

func (f *failingFile) Write(b []byte) (int, error) {
	if f.failWrite {
		n, _ := f.journalFile.Write(b[:len(b)/2])
		return n, errors.New("injected: no space left on device")
	}
	return f.journalFile.Write(b)
}

func (f *failingFile) Truncate(n int64) error {
	if f.failTruncate {
		return errors.New("injected: truncate failed")
	}
	return f.journalFile.Truncate(n)
}

func TestJournalWriteFailureIsStickyWhenTheCutFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sb.journal")
	j, err := openJournal(testContext(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.append(&record{Type: recCheckpoint, Checkpoint: "ck-1"}, true); err != nil {
		t.Fatal(err)
	}
	ff := &failingFile{journalFile: j.f, failWrite: true}
	j.f = ff
	if err := j.append(&record{Type: recCheckpoint, Checkpoint: "ck-2"}, true); err == nil {
		t.Fatal("failed write reported success")
	}
	ff.failWrite = false // the cut worked: later records may follow
	if err := j.append(&record{Type: recCheckpoint, Checkpoint: "ck-3"}, true); err != nil {
		t.Fatalf("append after a cut partial record: %v", err)
	}
	ff.failWrite, ff.failTruncate = true, true
	first := j.append(&record{Type: recCheckpoint, Checkpoint: "ck-4"}, true)
	ff.failWrite, ff.failTruncate = false, false
	second := j.append(&record{Type: recCheckpoint, Checkpoint: "ck-5"}, true)
	if first == nil || second == nil || !strings.Contains(second.Error(), "takes no more records") {
		t.Fatalf("errors %v / %v: the second append must fail like the first", first, second)
	}
	_ = j.close()
	data, _ := os.ReadFile(path)
	j2 := &journal{path: path, byID: map[string]*effectState{}}
	if _, dmg := j2.replay(data); len(dmg) != 0 || j2.ckpt != "ck-3" {
		t.Fatalf("replay: damage %v, checkpoint %q (want ck-3 then the torn ck-4 only)", dmg, j2.ckpt)
	}
}

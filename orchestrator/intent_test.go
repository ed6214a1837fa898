package orchestrator

import (
	"os"
	"path/filepath"
	"testing"
)

func TestIntentRoundTripAndTorn(t *testing.T) {
	dir := t.TempDir()
	l, err := openIntents(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if in, err := l.read(); err != nil || in != nil {
		t.Fatalf("fresh intent file: %+v, %v", in, err)
	}
	want := rollbackIntent{Target: "7", Watermark: 3, StateSeq: 9, StateFrom: 12, Discard: []string{"8", "9"}}
	if err := l.write(want); err != nil {
		t.Fatal(err)
	}
	got, err := l.read()
	if err != nil || got == nil || got.Target != "7" || got.StateFrom != 12 || len(got.Discard) != 2 {
		t.Fatalf("read back %+v, %v", got, err)
	}
	// A torn write (payload half written) reads as no intent: nothing had changed yet.
	f, _ := os.OpenFile(filepath.Join(dir, intentFile), os.O_WRONLY, 0)
	f.WriteAt([]byte("garbage"), intentHead+4)
	f.Close()
	if in, err := l.read(); err != nil || in != nil {
		t.Fatalf("torn intent: %+v, %v; want none", in, err)
	}
	if err := l.write(want); err != nil {
		t.Fatal(err)
	}
	if err := l.clear(); err != nil {
		t.Fatal(err)
	}
	if in, _ := l.read(); in != nil {
		t.Fatalf("cleared intent reads %+v", in)
	}
	if st, _ := os.Stat(filepath.Join(dir, intentFile)); st.Size() != intentSize {
		t.Fatalf("intent file is %d bytes, want preallocated %d", st.Size(), intentSize)
	}
}

// BenchmarkIntentWrite is what a rollback adds to its frozen window: one in-place write
// and fdatasync of the intent, and the clear (no sync).
func BenchmarkIntentWrite(b *testing.B) {
	l, err := openIntents(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer l.close()
	in := rollbackIntent{Target: "12", Watermark: 40, StateSeq: 300, StateFrom: 310, Discard: []string{"13", "14"}}
	for i := 0; i < b.N; i++ {
		if err := l.write(in); err != nil {
			b.Fatal(err)
		}
		if err := l.clear(); err != nil {
			b.Fatal(err)
		}
	}
}

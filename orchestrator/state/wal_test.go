package state

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// logWithRollback writes /v=1, /v=2, then rolls back to seq 1: the final record is the
// rollback marker, already synced when RollbackTo returned.
func logWithRollback(t *testing.T) (dir string, frames []int) {
	t.Helper()
	dir = t.TempDir()
	s := openStore(t, dir)
	patch(t, s, `{"op":"add","path":"/v","value":1}`)
	frames = append(frames, int(logSize(t, dir)))
	patch(t, s, `{"op":"replace","path":"/v","value":2}`)
	frames = append(frames, int(logSize(t, dir)))
	if _, err := s.RollbackTo(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	frames = append(frames, int(logSize(t, dir)))
	wantDoc(t, s, `{"v":1}`)
	noErr(t, s.Close())
	return dir, frames // frames[i]: end offset of record i
}

func editLog(t *testing.T, dir string, fn func([]byte) []byte) {
	t.Helper()
	p := filepath.Join(dir, logName)
	data, err := os.ReadFile(p)
	noErr(t, err)
	noErr(t, os.WriteFile(p, fn(data), 0o600))
}

// The corruption matrix of the state log: each case damages the log on disk and reopens it.
// A torn write (what a crash mid-append leaves) is cut off and the synced records survive;
// every other damage refuses the open with data loss, naming the offset, so that a synced
// record (here the rollback marker) is never silently dropped and a rolled-back value never
// served.
func TestStateLogCorruptionMatrix(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(data []byte, frames []int) []byte
		wantDoc string // "" wants data loss
		wantMsg string
	}{
		{"torn tail: final record cut short", func(d []byte, fr []int) []byte { return d[:len(d)-5] }, `{"v":2}`, ""},
		{"torn tail: final header cut short", func(d []byte, fr []int) []byte { return d[:fr[1]+3] }, `{"v":2}`, ""},
		{"torn tail: final record's payload pages unwritten (power loss)", func(d []byte, fr []int) []byte {
			for i := fr[1] + frameHeader; i < len(d); i++ {
				d[i] = 0
			}
			return d
		}, `{"v":2}`, ""},
		{"zeros after the last record", func(d []byte, fr []int) []byte { return append(d, make([]byte, 100)...) }, `{"v":1}`, ""},
		{"flipped byte in the middle record", func(d []byte, fr []int) []byte {
			d[fr[0]+frameHeader+4] ^= 0x01
			return d
		}, "", "with data after it"},
		{"flipped byte in the last (synced) record", func(d []byte, fr []int) []byte {
			d[len(d)-3] ^= 0x01
			return d
		}, "", "complete but fails its checksum"},
		{"flipped byte in the last record's checksum", func(d []byte, fr []int) []byte {
			d[fr[1]+5] ^= 0x01
			return d
		}, "", "complete but fails its checksum"},
		{"last record's length made longer", func(d []byte, fr []int) []byte {
			n := binary.LittleEndian.Uint32(d[fr[1]:])
			binary.LittleEndian.PutUint32(d[fr[1]:], n+16)
			return d
		}, "", "damaged"},
		{"last record's length made shorter", func(d []byte, fr []int) []byte {
			n := binary.LittleEndian.Uint32(d[fr[1]:])
			binary.LittleEndian.PutUint32(d[fr[1]:], n-1)
			return d
		}, "", "with data after it"},
		{"missing log", nil, "", "state log state.log is missing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, frames := logWithRollback(t)
			if tc.edit == nil {
				noErr(t, os.Remove(filepath.Join(dir, logName)))
			} else {
				editLog(t, dir, func(d []byte) []byte { return tc.edit(d, frames) })
			}
			s, err := Open(context.Background(), dir)
			if tc.wantDoc == "" {
				if !errors.Is(err, errdefs.ErrDataLoss) || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("Open = %v, want data loss saying %q", err, tc.wantMsg)
				}
				return
			}
			noErr(t, err)
			defer s.Close()
			wantDoc(t, s, tc.wantDoc)
			patch(t, s, `{"op":"add","path":"/w","value":3}`) // the cut log takes appends
			noErr(t, s.Verify(context.Background()))
		})
	}
}

// A new store's directory is not mistaken for one that lost its log.
func TestNewStoreIsNotMissingLog(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	noErr(t, s.Close())
	s = openStore(t, dir)
	noErr(t, s.Close())
}

func noErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

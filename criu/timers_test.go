//go:build linux

package criu

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timer"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timerfd"
	"google.golang.org/protobuf/proto"
)

func timerfdEntry(id uint32, vnsec, insec uint64) *fdinfo.FileEntry {
	u := proto.Uint32(0)
	return &fdinfo.FileEntry{Type: fdinfo.FdTypes_TIMERFD.Enum(), Id: proto.Uint32(id), Tfd: &timerfd.TimerfdEntry{
		Id: proto.Uint32(id), Flags: u, Fown: &fown.FownEntry{Uid: u, Euid: u, Signum: u, PidType: u, Pid: u},
		Clockid: proto.Uint32(1), Ticks: proto.Uint64(3), SettimeFlags: u,
		Vsec: proto.Uint64(0), Vnsec: proto.Uint64(vnsec), Isec: proto.Uint64(0), Insec: proto.Uint64(insec),
	}}
}

// TestRearmExpiredTimers: a periodic timerfd that expired while frozen ("0 left") gets its
// interval as the time left, so the restored timer is armed; a disarmed one-shot timer and an
// armed one stay as they were, and the image keeps its header and entries.
func TestRearmExpiredTimers(t *testing.T) {
	dir := t.TempDir()
	header := []byte{0x54, 0x50, 0x58, 0x56, 0x11, 0x22, 0x33, 0x44}
	img := append([]byte(nil), header...)
	for _, e := range []*fdinfo.FileEntry{timerfdEntry(1, 0, 50e6), timerfdEntry(2, 0, 0), timerfdEntry(3, 20e6, 50e6)} {
		b, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		img = binary.LittleEndian.AppendUint32(img, uint32(len(b)))
		img = append(img, b...)
	}
	path := filepath.Join(dir, "files.img")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rearmExpiredTimers(dir); err != nil {
		t.Fatal(err)
	}
	var got []*timerfd.TimerfdEntry
	if err := editImage(path, &fdinfo.FileEntry{}, func(m proto.Message) bool {
		got = append(got, m.(*fdinfo.FileEntry).GetTfd())
		return false
	}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if len(got) != 3 || string(data[:8]) != string(header) {
		t.Fatalf("image has %d entries, header %x", len(got), data[:8])
	}
	for i, want := range []uint64{50e6, 0, 20e6} {
		if got[i].GetVnsec() != want || got[i].GetTicks() != 3 {
			t.Errorf("timerfd %d: %d ns left, %d ticks; want %d ns, 3 ticks", i+1, got[i].GetVnsec(), got[i].GetTicks(), want)
		}
	}

	expired := &timer.ItimerEntry{Isec: proto.Uint64(0), Iusec: proto.Uint64(50000), Vsec: proto.Uint64(0), Vusec: proto.Uint64(0)}
	if !rearmItimer(expired) || expired.GetVusec() != 50000 {
		t.Errorf("expired periodic itimer not re-armed: %v", expired)
	}
	off := &timer.ItimerEntry{Isec: proto.Uint64(0), Iusec: proto.Uint64(0), Vsec: proto.Uint64(0), Vusec: proto.Uint64(0)}
	if rearmItimer(off) {
		t.Error("a disarmed itimer was armed")
	}
}

//go:build linux

package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timer"
	"google.golang.org/protobuf/proto"
)

// rearmExpiredTimers fixes periodic timers that expired while the dumped processes were
// frozen. Such a timer is not re-armed until its process runs again (the kernel forwards a
// periodic timerfd when it is read and an itimer when its SIGALRM is dequeued), so CRIU reads
// "0 left, interval N" and restores exactly that: a timer with no time left, which the kernel
// takes as disarmed. The restored process then waits forever for its next tick. The images
// get the interval as the time left instead: the timer fires one interval after the restore
// (the expirations already counted are restored as they were). It rewrites files.img
// (timerfd) and each core-<pid>.img (setitimer and POSIX timers).
func rearmExpiredTimers(dir string) error {
	if err := editImage(filepath.Join(dir, "files.img"), &fdinfo.FileEntry{}, func(m proto.Message) bool {
		t := m.(*fdinfo.FileEntry).GetTfd()
		if t == nil || t.GetVsec() != 0 || t.GetVnsec() != 0 || (t.GetIsec() == 0 && t.GetInsec() == 0) {
			return false
		}
		t.Vsec, t.Vnsec = proto.Uint64(t.GetIsec()), proto.Uint64(t.GetInsec())
		return true
	}); err != nil {
		return err
	}
	cores, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
	if err != nil {
		return err
	}
	for _, path := range cores {
		if err := editImage(path, &criu_core.CoreEntry{}, func(m proto.Message) bool {
			ts := m.(*criu_core.CoreEntry).GetTc().GetTimers()
			if ts == nil {
				return false
			}
			changed := false
			for _, it := range []*timer.ItimerEntry{ts.GetReal(), ts.GetVirt(), ts.GetProf()} {
				changed = rearmItimer(it) || changed
			}
			for _, pt := range ts.GetPosix() {
				if pt.GetVsec() == 0 && pt.GetVnsec() == 0 && (pt.GetIsec() != 0 || pt.GetInsec() != 0) {
					pt.Vsec, pt.Vnsec = proto.Uint64(pt.GetIsec()), proto.Uint64(pt.GetInsec())
					changed = true
				}
			}
			return changed
		}); err != nil {
			return err
		}
	}
	return nil
}

// rearmItimer gives an expired periodic itimer its interval as the time left.
func rearmItimer(it *timer.ItimerEntry) bool {
	if it == nil || it.GetVsec() != 0 || it.GetVusec() != 0 || (it.GetIsec() == 0 && it.GetIusec() == 0) {
		return false
	}
	it.Vsec, it.Vusec = proto.Uint64(it.GetIsec()), proto.Uint64(it.GetIusec())
	return true
}

// imageHeader is the size of a CRIU image's header: the common magic, then the image's.
const imageHeader = 8

// editImage decodes the CRIU image at path (a header, then entries of entryType, each a
// little-endian uint32 size and the protobuf message), applies fix to every entry and, if
// one changed, writes the image back atomically. A missing image is fine. (go-criu's crit
// package would do it but cannot be linked next to go-criu's stats package: both register
// stats.proto.)
func editImage(path string, entryType proto.Message, fix func(proto.Message) bool) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(data) < imageHeader {
		return fmt.Errorf("CRIU image %s: too short", path)
	}
	out := append([]byte(nil), data[:imageHeader]...)
	changed := false
	for rest := data[imageHeader:]; len(rest) > 0; {
		if len(rest) < 4 || uint64(len(rest)-4) < uint64(binary.LittleEndian.Uint32(rest)) {
			return fmt.Errorf("CRIU image %s: truncated entry", path)
		}
		n := binary.LittleEndian.Uint32(rest)
		raw := rest[4 : 4+n]
		rest = rest[4+n:]
		m := proto.Clone(entryType)
		proto.Reset(m)
		if err := proto.Unmarshal(raw, m); err != nil {
			return fmt.Errorf("CRIU image %s: %w", path, err)
		}
		if fix(m) {
			changed = true
			if raw, err = proto.Marshal(m); err != nil {
				return fmt.Errorf("CRIU image %s: %w", path, err)
			}
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(raw)))
		out = append(out, raw...)
	}
	if !changed {
		return nil
	}
	return writeFileAtomic(path, out, 0o600)
}

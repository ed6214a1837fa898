package state

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// The log is a sequence of frames: a 4-byte little-endian payload length, the payload's
// 4-byte little-endian CRC-32C, then the payload, one JSON record. A patch writes one record
// holding all its ops, so a patch is in the log entirely or not at all.

const (
	logName     = "state.log"
	frameHeader = 8
	maxPayload  = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record types.
const (
	recPatch    = "patch"    // Entries: the ops of one patch, with their inverses
	recRollback = "rollback" // Seq: the marker's own number; To: the point rolled back to
	recBase     = "base"     // first record after a compaction; Seq: the compaction point
)

type record struct {
	Type    string    `json:"type"`
	Seq     uint64    `json:"seq,omitempty"`
	To      uint64    `json:"to,omitempty"`
	Time    time.Time `json:"time,omitzero"`
	Entries []Entry   `json:"entries,omitempty"`
}

// Entry is one applied op as the log keeps it.
type Entry struct {
	Seq        uint64    `json:"seq"`
	Checkpoint string    `json:"checkpoint"`
	Op         Op        `json:"op"`
	Inverse    []Op      `json:"inverse"` // applied in order, they undo Op
	Time       time.Time `json:"time"`
}

// clone returns a deep copy of e, so callers cannot change the log through it.
func (e Entry) clone() Entry {
	e.Op = e.Op.clone()
	inv := make([]Op, len(e.Inverse))
	for i, o := range e.Inverse {
		inv[i] = o.clone()
	}
	e.Inverse = inv
	return e
}

// appendFrame encodes rec and appends its frame to buf.
func appendFrame(buf []byte, rec record) ([]byte, error) {
	payload, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode log record: %w", err)
	}
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(payload)))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

// scanLog decodes the frames of data. It returns the records and the length of the valid
// prefix. A damaged frame at the end (a torn write: short header, short payload, bad checksum
// of the last frame, or zero fill) ends the valid prefix; damage followed by more data is
// corruption and wraps errdefs.ErrDataLoss.
func scanLog(data []byte) ([]record, int, error) {
	var recs []record
	off := 0
	for off < len(data) {
		payload, ok := nextFrame(data[off:])
		if !ok {
			if tornTail(data[off:]) {
				return recs, off, nil
			}
			return nil, 0, fmt.Errorf("state log damaged at offset %d with data after it: %w", off, errdefs.ErrDataLoss)
		}
		var rec record
		if err := json.Unmarshal(payload, &rec); err != nil {
			return nil, 0, fmt.Errorf("state log record at offset %d: %v: %w", off, err, errdefs.ErrDataLoss)
		}
		recs = append(recs, rec)
		off += frameHeader + len(payload)
	}
	return recs, off, nil
}

// nextFrame returns the payload of the frame at the start of b, if it is complete and intact.
func nextFrame(b []byte) ([]byte, bool) {
	if len(b) < frameHeader {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n == 0 || n > maxPayload || n > len(b)-frameHeader {
		return nil, false
	}
	payload := b[frameHeader : frameHeader+n]
	return payload, crc32.Checksum(payload, castagnoli) == binary.LittleEndian.Uint32(b[4:])
}

// tornTail reports whether b, starting with a bad frame, looks like an interrupted final
// write: too short for a header, a length running past the end, the last frame with a bad
// checksum, or nothing but zeros.
func tornTail(b []byte) bool {
	if len(b) < frameHeader || len(bytes.Trim(b, "\x00")) == 0 {
		return true
	}
	n := int(binary.LittleEndian.Uint32(b))
	return n > len(b)-frameHeader || frameHeader+n == len(b)
}

// logFile is the append-only log as the store uses it; tests substitute failing ones.
type logFile interface {
	Write(p []byte) (int, error)
	Truncate(size int64) error
	Sync() error
	Close() error
}

// osLog is a log file on disk; Sync is fdatasync (the appended size is data for it).
type osLog struct{ f *os.File }

func openLog(path string) (osLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return osLog{}, fmt.Errorf("open state log: %w", err)
	}
	return osLog{f: f}, nil
}

func (l osLog) Write(p []byte) (int, error) { return l.f.Write(p) }
func (l osLog) Truncate(size int64) error   { return l.f.Truncate(size) }
func (l osLog) Close() error                { return l.f.Close() }
func (l osLog) Sync() error {
	sc, err := l.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := sc.Control(func(fd uintptr) { serr = unix.Fdatasync(int(fd)) }); err != nil {
		return err
	}
	return serr
}

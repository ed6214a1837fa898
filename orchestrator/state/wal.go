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

// scanLog decodes the frames of data (the whole log file). It returns the records and the
// length of the valid prefix. A final frame that an interrupted write left (see tornTail)
// ends the valid prefix; any other bad frame, the final one included, is damage and wraps
// errdefs.ErrDataLoss.
func scanLog(data []byte) ([]record, int, error) {
	var recs []record
	off := 0
	for off < len(data) {
		payload, ok := nextFrame(data[off:])
		if !ok {
			if tornTail(data[off:], off) {
				return recs, off, nil
			}
			return nil, 0, damaged(data[off:], off)
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

// damaged describes the damage of the bad frame b at offset off.
func damaged(b []byte, off int) error {
	if len(b) >= frameHeader && frameHeader+int(binary.LittleEndian.Uint32(b)) == len(b) {
		return fmt.Errorf("state log damaged: its last record (offset %d, %d bytes) is complete but fails its checksum, "+
			"so it was written whole and changed since (not a torn write): %w", off, len(b), errdefs.ErrDataLoss)
	}
	return fmt.Errorf("state log damaged at offset %d with data after it: %w", off, errdefs.ErrDataLoss)
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

// logPage is the unit in which a crash can leave a file's appended data unwritten (reading
// back as zeros): the page cache's page, which is also the filesystems' block size here.
const logPage = 4096

// tornTail reports whether b, a frame at file offset off that did not check, is what an
// interrupted final write leaves. A process killed mid-write leaves a prefix of the frame: a
// header cut short or a length that runs past the end (unless the bytes that are there are
// one whole record with the recorded checksum: then the length field itself was changed). A
// power loss may also leave a final frame of full length whose unwritten pages read back as
// zeros (a JSON payload never holds a zero byte). A final frame of full length with a bad
// checksum and no such page was written whole and changed afterwards: that is damage, not a
// torn write (it was synced, and dropping it would drop an acknowledged record).
func tornTail(b []byte, off int) bool {
	if len(b) < frameHeader || len(bytes.Trim(b, "\x00")) == 0 {
		return true
	}
	n := int(binary.LittleEndian.Uint32(b))
	rest := b[frameHeader:]
	if n > len(rest) {
		return !json.Valid(rest) || crc32.Checksum(rest, castagnoli) != binary.LittleEndian.Uint32(b[4:])
	}
	return frameHeader+n == len(b) && hasUnwrittenPage(rest, off+frameHeader)
}

// hasUnwrittenPage reports whether payload (at file offset off) has a piece, between two page
// boundaries or a boundary and its end, that is all zeros.
func hasUnwrittenPage(payload []byte, off int) bool {
	for len(payload) > 0 {
		n := min(len(payload), logPage-off%logPage)
		if len(bytes.Trim(payload[:n], "\x00")) == 0 {
			return true
		}
		payload, off = payload[n:], off+n
	}
	return false
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

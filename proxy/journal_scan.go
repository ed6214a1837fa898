package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/containerd/errdefs"
)

// A journal file is a sequence of records, each framed as
//
//	uint32 little-endian payload length | uint32 CRC-32C of the payload | JSON payload
//
// appended, and rewritten only by compaction (a new file renamed over the old one).
//
// Opening a journal tells two kinds of bad bytes apart. A torn tail is what a crash during an
// append leaves: a frame at the end that is too short for its header, whose length runs past
// the end of the file, or that ends in zero fill; nothing intact follows it. It was never
// acknowledged (appends are synced before anyone is told), so it is cut off. Anything else
// that does not decode is damage: a frame with intact records after it, or a complete last
// frame that fails its checksum (a record already synced and then changed). Damage is never
// cut off or guessed around: the intact records on both sides are loaded, the journal is
// marked damaged, and commits of the sandbox are refused naming the damaged bytes and the
// effects they may concern (damageError); the operator decides each effect by name (retry or
// abandon) or releases the sandbox.

const (
	frameHeader = 8
	maxRecord   = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// payloadStart is how every record's JSON begins (encodeRecord marshals Type first).
var payloadStart = []byte(`{"t":`)

// span is a damaged byte range [off, end) of a journal file.
type span struct{ off, end int64 }

// replay applies every intact record of data. It returns the offset where the journal's
// valid content ends (before a torn tail, else len(data)) and the damaged ranges.
func (j *journal) replay(data []byte) (int64, []span) {
	var dmg []span
	off := 0
	for off < len(data) {
		rec, n, ok := decodeRecord(data[off:])
		if ok {
			j.apply(rec, int64(off), int64(n))
			off += n
			continue
		}
		next := nextIntact(data, off+1)
		if next < 0 {
			if tornTail(data[off:]) {
				return int64(off), dmg
			}
			return int64(len(data)), append(dmg, span{int64(off), int64(len(data))})
		}
		dmg = append(dmg, span{int64(off), int64(next)})
		off = next
	}
	return int64(off), dmg
}

// nextIntact returns the offset of the first intact record at or after from, or -1.
func nextIntact(data []byte, from int) int {
	for i := from; i+frameHeader+len(payloadStart) <= len(data); i++ {
		if !bytes.HasPrefix(data[i+frameHeader:], payloadStart) {
			continue
		}
		if _, _, ok := decodeRecord(data[i:]); ok {
			return i
		}
	}
	return -1
}

// tornTail reports whether b, a bad frame with nothing intact after it, is an interrupted
// append: too short for a header, a length running past the end, or zero fill at its end (a
// record's JSON never ends with a zero byte).
func tornTail(b []byte) bool {
	if len(b) < frameHeader || len(bytes.Trim(b, "\x00")) == 0 {
		return true
	}
	n := int(binary.LittleEndian.Uint32(b))
	return n > len(b)-frameHeader || b[len(b)-1] == 0
}

func encodeRecord(r *record) ([]byte, error) {
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode journal record: %w", err)
	}
	if len(payload) > maxRecord {
		return nil, fmt.Errorf("journal record of %d bytes: %w", len(payload), errdefs.ErrResourceExhausted)
	}
	buf := make([]byte, frameHeader, frameHeader+len(payload))
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

// decodeRecord decodes the record at the start of data; ok is false for a short, corrupt or
// undecodable record.
func decodeRecord(data []byte) (rec *record, n int, ok bool) {
	if len(data) < frameHeader {
		return nil, 0, false
	}
	size := int(binary.LittleEndian.Uint32(data[0:4]))
	if size > maxRecord || len(data) < frameHeader+size {
		return nil, 0, false
	}
	payload := data[frameHeader : frameHeader+size]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(data[4:8]) {
		return nil, 0, false
	}
	rec = &record{}
	if err := json.Unmarshal(payload, rec); err != nil || rec.Type == "" {
		return nil, 0, false
	}
	return rec, frameHeader + size, true
}

// damageError describes the journal's damage, or is nil if there is none: the damaged byte
// ranges, the sequence numbers with no effect record (lost effects), and the effects whose
// status an unreadable record may have changed (held or sending ones recorded before the
// damage: it may have dropped, released or failed them). Callers hold j.mu.
func (j *journal) damageError() error {
	if len(j.damaged) == 0 && j.missing == "" {
		return nil
	}
	var parts []string
	if j.missing != "" {
		parts = append(parts, j.missing)
	}
	for _, d := range j.damaged {
		parts = append(parts, fmt.Sprintf("bytes %d-%d (%d) do not decode", d.off, d.end, d.end-d.off))
	}
	if gaps := j.seqGaps(); len(gaps) > 0 {
		parts = append(parts, "effects with seq "+strings.Join(gaps, ", ")+" are lost")
	}
	if sus := j.suspects(); len(sus) > 0 {
		parts = append(parts, "the status of "+strings.Join(sus, ", ")+" may be wrong")
	}
	return fmt.Errorf("effect journal %s is damaged: %s; commit is refused: decide each effect with `deltabox effects retry|abandon`, or release the sandbox: %w",
		j.path, strings.Join(parts, "; "), errdefs.ErrDataLoss)
}

// seqGaps lists the ranges of sequence numbers below the newest effect's that have no effect
// record ("3", "5-9").
func (j *journal) seqGaps() []string {
	var out []string
	next := uint64(1)
	for _, st := range j.effects {
		switch {
		case st.Seq == next+1:
			out = append(out, fmt.Sprint(next))
		case st.Seq > next+1:
			out = append(out, fmt.Sprintf("%d-%d", next, st.Seq-1))
		}
		next = max(next, st.Seq+1)
	}
	return out
}

// suspects lists the effects a lost record may concern (suspect). Callers hold j.mu.
func (j *journal) suspects() []string {
	var out []string
	for _, st := range j.effects {
		if j.suspect(st) {
			out = append(out, fmt.Sprintf("%s (seq %d, %s)", st.ID, st.Seq, st.Status))
		}
	}
	return out
}

// suspect reports whether a lost record may have changed st: it is held, sending or failed
// (what a commit would send) and was recorded before the last damaged range. Callers hold
// j.mu.
func (j *journal) suspect(st *effectState) bool {
	if len(j.damaged) == 0 {
		return false
	}
	switch st.Status {
	case StatusHeld, StatusSending, StatusFailed:
		return st.off < j.damaged[len(j.damaged)-1].off
	}
	return false
}

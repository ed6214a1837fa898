package orchestrator

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/failpoint"
)

// A rollback changes the effect journal, the files and the agent state one after another.
// Before the first change it writes a rollback intent: a small record, overwritten in place
// in a preallocated file (one fdatasync, no directory update), naming the target and what
// the rollback must reach. Once every part is done the record is cleared (without a sync: a
// killed daemon's writes stay in the page cache; only power loss can lose the clear, and
// then the redo repeats a finished rollback on a sandbox that did not survive either). At
// start an intent still found is redone before the sandbox serves, so a rollback is all or
// nothing; every step is idempotent.

const (
	intentFile  = "intent"
	intentSize  = 64 << 10
	intentMagic = 0x44424931 // "DBI1"
	intentHead  = 12         // magic, payload length, CRC-32C of the payload
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// rollbackIntent is a rollback that began and may not have finished.
type rollbackIntent struct {
	ID        string `json:"id,omitempty"`         // random; names the rollback in its head record
	Target    string `json:"target"`               // checkpoint rolled back to
	Watermark uint64 `json:"watermark"`            // effects after it (the common ancestor's) are dropped
	StateSeq  uint64 `json:"state_seq"`            // the target's state sequence number
	StateFrom uint64 `json:"state_from"`           // the state's sequence number when the rollback began
	StateBase bool   `json:"state_base,omitempty"` // the log no longer reaches it: restore the kept document
	// Rebuild: the target's state is no longer a point of the log (another branch, or
	// compacted): the document is rebuilt from the current one by undoing the ops since
	// the head (From, its state at FromSeq) up to the common ancestor and replaying the
	// recorded ops down to the target, and written as one patch.
	Rebuild bool   `json:"rebuild,omitempty"`
	From    string `json:"from,omitempty"`
	FromSeq uint64 `json:"from_seq,omitempty"`
	// Discard and Images are read from intents of earlier versions (which deleted the
	// checkpoints after the target) and ignored: a rollback deletes nothing.
	Discard []string `json:"discard,omitempty"`
	Images  []string `json:"images,omitempty"`
}

// intentLog is a session's intent file, open for in-place writes.
type intentLog struct{ f *os.File }

// openIntents opens (creating and preallocating) the intent file in dir.
func openIntents(dir string) (*intentLog, error) {
	path := filepath.Join(dir, intentFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open rollback intent: %w", err)
	}
	st, err := f.Stat()
	if err == nil && st.Size() < intentSize {
		// Allocated once, so that writing an intent never needs space (a full disk cannot
		// stop a rollback from recording what it is about to do).
		if err = f.Truncate(intentSize); err == nil {
			err = unix.Fallocate(int(f.Fd()), 0, 0, intentSize)
			if errors.Is(err, unix.EOPNOTSUPP) {
				err = nil
			}
		}
		if err == nil {
			err = f.Sync()
		}
		if err == nil {
			err = atomicfile.SyncDir(dir)
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("prepare rollback intent file: %w", err)
	}
	return &intentLog{f: f}, nil
}

// read returns the recorded intent, or nil if there is none. A torn record counts as none:
// it was being written when the process died, before the rollback changed anything.
func (l *intentLog) read() (*rollbackIntent, error) {
	buf := make([]byte, intentSize)
	n, err := l.f.ReadAt(buf, 0)
	if n < intentHead {
		if err == nil {
			err = errors.New("short read")
		}
		return nil, fmt.Errorf("read rollback intent: %w", err)
	}
	if binary.LittleEndian.Uint32(buf) != intentMagic {
		return nil, nil
	}
	size := binary.LittleEndian.Uint32(buf[4:])
	if size == 0 || int(size) > n-intentHead {
		return nil, nil
	}
	payload := buf[intentHead : intentHead+int(size)]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(buf[8:]) {
		return nil, nil
	}
	var in rollbackIntent
	if err := json.Unmarshal(payload, &in); err != nil {
		return nil, nil
	}
	return &in, nil
}

// write records in durably (one fdatasync).
func (l *intentLog) write(in rollbackIntent) error {
	synced, err := l.writeAsync(in)
	if err != nil {
		return err
	}
	return synced()
}

// writeAsync is write whose fdatasync runs in the background: the record is in the page
// cache when it returns (a killed daemon's next start finds it); synced waits for the sync
// and returns its error.
func (l *intentLog) writeAsync(in rollbackIntent) (synced func() error, err error) {
	payload, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	if len(payload) > intentSize-intentHead {
		return nil, fmt.Errorf("rollback intent of %d bytes does not fit its record", len(payload))
	}
	buf := make([]byte, intentHead+len(payload))
	binary.LittleEndian.PutUint32(buf, intentMagic)
	binary.LittleEndian.PutUint32(buf[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[8:], crc32.Checksum(payload, castagnoli))
	copy(buf[intentHead:], payload)
	if _, err := l.f.WriteAt(buf, 0); err != nil {
		return nil, fmt.Errorf("write rollback intent: %w", err)
	}
	done, fd := make(chan error, 1), int(l.f.Fd())
	go func() {
		err := failpoint.Inject("rollback/intent-sync")
		if err == nil {
			err = unix.Fdatasync(fd)
		}
		done <- err
	}()
	var once sync.Once
	var serr error
	return func() error {
		once.Do(func() { serr = <-done })
		if serr != nil {
			return fmt.Errorf("sync rollback intent: %w", serr)
		}
		return nil
	}, nil
}

// clear marks the intent finished (no sync: see above).
func (l *intentLog) clear() error {
	var zero [intentHead]byte
	if _, err := l.f.WriteAt(zero[:], 0); err != nil {
		return fmt.Errorf("clear rollback intent: %w", err)
	}
	return nil
}

func (l *intentLog) close() error {
	if l == nil || l.f == nil {
		return nil
	}
	return l.f.Close()
}

// nonce returns a random ID for a rollback intent.
func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

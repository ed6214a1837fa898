package pool

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

var (
	bucketPools      = []byte("pools")
	bucketContainers = []byte("containers")
)

// Lease is the per-lease part of a sandbox: its public ID and late-bound settings.
type Lease struct {
	ID       string            `json:"id"`
	Env      []string          `json:"env,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	LeasedAt time.Time         `json:"leased_at"`
	// EgressPolicy overrides the template's egress policy for this lease (YAML).
	EgressPolicy string `json:"egress_policy,omitempty"`
	// RestoredFrom and ForkedFrom record where a restored sandbox came from (opaque to the pool).
	RestoredFrom string `json:"restored_from,omitempty"`
	ForkedFrom   string `json:"forked_from,omitempty"`
}

// record is what survives a daemon restart about one sandbox container.
type record struct {
	CID     string    `json:"cid"`
	Pool    string    `json:"pool"`
	Created time.Time `json:"created"`
	Lease   *Lease    `json:"lease,omitempty"` // nil while ready
	// Destroying is the tombstone of a sandbox whose destroy failed: it is retried, and the
	// next start destroys it instead of adopting it (a released lease never comes back).
	Destroying bool `json:"destroying,omitempty"`
}

// store keeps pool templates and sandbox records in a bbolt database, which commits
// atomically and durably (fdatasync) on every update. bbolt checks its meta pages but not the
// values it stores, so each value carries its own checksum (see encodeValue); the file is
// checked before it is mapped (see checkBoltFile).
type store struct {
	db *bolt.DB
	// damage says what was wrong with the database when it was opened ("" when nothing):
	// it was set aside and what could be read salvaged into a fresh one.
	damage string
}

// openStore opens the pool database at path, first checking that it can be mapped safely
// and, once open, that bbolt's own page check passes. A database that fails either is set
// aside (path.damaged-<time>) and replaced by a fresh one holding what could be salvaged.
func openStore(path string) (*store, error) {
	why, err := checkBoltFile(path)
	if err != nil {
		return nil, fmt.Errorf("check pool database %s: %w", path, err)
	}
	if why == "" {
		db, err := openBolt(path)
		if err != nil {
			return nil, err
		}
		if why = checkOpenDB(db); why == "" {
			return &store{db: db}, nil
		}
		db.Close()
	}
	return recoverStore(path, why)
}

// recoverStore sets a damaged database aside and opens a fresh one with what it salvages.
func recoverStore(path, why string) (*store, error) {
	kept, err := setAsideDB(path)
	if err != nil {
		return nil, err
	}
	db, err := openBolt(path)
	if err != nil {
		return nil, err
	}
	s := &store{db: db}
	n, serr := salvage(s, kept)
	s.damage = fmt.Sprintf("pool database was damaged (%s); kept as %s, %d entries salvaged", why, kept, n)
	if serr != nil {
		s.damage += fmt.Sprintf(" (salvage stopped: %v)", serr)
	}
	return s, nil
}

func openBolt(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open pool database %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPools, bucketContainers} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init pool database: %w", err)
	}
	return db, nil
}

func (s *store) close() error { return s.db.Close() }

// Values are "DBX1", the CRC-32C of the JSON that follows, then the JSON. Values of earlier
// versions are plain JSON and are still read.
const valueMagic = "DBX1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encodeValue(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(valueMagic)+4+len(data))
	out = append(out, valueMagic...)
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(data, castagnoli))
	return append(out, data...), nil
}

// decodeValue checks a value's checksum and decodes it into v.
func decodeValue(raw []byte, v any) error {
	data := raw
	if bytes.HasPrefix(raw, []byte(valueMagic)) {
		if len(raw) < len(valueMagic)+4 {
			return fmt.Errorf("value cut short: %w", errdefs.ErrDataLoss)
		}
		data = raw[len(valueMagic)+4:]
		if crc32.Checksum(data, castagnoli) != binary.LittleEndian.Uint32(raw[len(valueMagic):]) {
			return fmt.Errorf("checksum mismatch: %w", errdefs.ErrDataLoss)
		}
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%v: %w", err, errdefs.ErrDataLoss)
	}
	return nil
}

func (s *store) put(bucket []byte, key string, v any) error {
	data, err := encodeValue(v)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), data) })
}

func (s *store) delete(bucket []byte, key string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(key)) })
}

// badEntry is a stored value that did not check or decode.
type badEntry struct {
	Key    string
	Reason string
}

// loadAll decodes every value of bucket; the values that do not check or decode are
// returned apart, by key, with the reason.
func loadAll[T any](s *store, bucket []byte) ([]T, []badEntry, error) {
	var out []T
	var bad []badEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			var item T
			if err := decodeValue(v, &item); err != nil {
				bad = append(bad, badEntry{Key: string(k), Reason: fmt.Sprintf("record %s/%s: %v", bucket, k, err)})
				return nil
			}
			out = append(out, item)
			return nil
		})
	})
	return out, bad, err
}

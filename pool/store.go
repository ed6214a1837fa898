package pool

import (
	"encoding/json"
	"fmt"
	"time"

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
// atomically and durably (fdatasync) on every update.
type store struct{ db *bolt.DB }

func openStore(path string) (*store, error) {
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
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

func (s *store) put(bucket []byte, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), data) })
}

func (s *store) delete(bucket []byte, key string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(key)) })
}

// loadAll decodes every value of bucket with decode.
func loadAll[T any](s *store, bucket []byte) ([]T, error) {
	var out []T
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			var item T
			if err := json.Unmarshal(v, &item); err != nil {
				return fmt.Errorf("decode %s/%s: %w", bucket, k, err)
			}
			out = append(out, item)
			return nil
		})
	})
	return out, err
}

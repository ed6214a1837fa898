package pool

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func newTestStore(t *testing.T) (string, *store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pool.db")
	s, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, s
}

func leasedRecord(cid string) record {
	return record{CID: cid, Pool: "p", Created: time.Now().UTC(), Lease: &Lease{ID: "sb-" + cid, LeasedAt: time.Now().UTC()}}
}

// rawPut stores raw bytes as a value, as a damaged (or older) database would hold them.
func rawPut(t *testing.T, s *store, key string, raw []byte) {
	t.Helper()
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketContainers).Put([]byte(key), raw) }); err != nil {
		t.Fatal(err)
	}
}

func rawGet(t *testing.T, s *store, key string) []byte {
	t.Helper()
	var out []byte
	_ = s.db.View(func(tx *bolt.Tx) error {
		out = append(out, tx.Bucket(bucketContainers).Get([]byte(key))...)
		return nil
	})
	return out
}

// One changed byte in a record is caught by its checksum and reported by key; the other
// records, and records of the previous (plain JSON) format, still load.
func TestRecordChecksum(t *testing.T) {
	_, s := newTestStore(t)
	defer s.close()
	for _, cid := range []string{"dbx-a", "dbx-b"} {
		if err := s.put(bucketContainers, cid, leasedRecord(cid)); err != nil {
			t.Fatal(err)
		}
	}
	legacy, _ := json.Marshal(leasedRecord("dbx-old"))
	rawPut(t, s, "dbx-old", legacy)
	raw := rawGet(t, s, "dbx-a")
	raw[len(raw)-10] ^= 0x01
	rawPut(t, s, "dbx-a", raw)

	recs, bad, err := loadAll[record](s, bucketContainers)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || len(bad) != 1 || bad[0].Key != "dbx-a" || !strings.Contains(bad[0].Reason, "checksum mismatch") {
		t.Fatalf("records %d, bad %+v; want 2 good and dbx-a bad by checksum", len(recs), bad)
	}
}

// A database cut in half is refused before bbolt maps it (mapping it died of SIGBUS), set
// aside, and what is readable of it salvaged into a fresh database.
func TestTruncatedDatabaseIsSetAside(t *testing.T) {
	path, s := newTestStore(t)
	for i := range 200 {
		cid := "dbx-" + strings.Repeat("x", 40) + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if err := s.put(bucketContainers, cid, leasedRecord(cid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.put(bucketPools, "p", Template{Name: "p", Image: "img"}); err != nil {
		t.Fatal(err)
	}
	s.close()
	// Cut below the pages in use (bbolt also grows the file past them, and cutting only
	// that preallocated tail loses nothing, which the check rightly accepts).
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	m, why := bestMeta(f, st.Size())
	f.Close()
	if why != "" {
		t.Fatalf("meta of the intact database: %s", why)
	}
	if err := os.Truncate(path, int64(m.pgid)*int64(m.pageSize)/2); err != nil {
		t.Fatal(err)
	}
	if why, _ := checkBoltFile(path); !strings.Contains(why, "cut short") {
		t.Fatalf("check of a truncated database: %q", why)
	}
	s, err = openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if !strings.Contains(s.damage, "cut short") || !strings.Contains(s.damage, ".damaged-") {
		t.Fatalf("damage = %q", s.damage)
	}
	kept, _ := filepath.Glob(path + ".damaged-*")
	if len(kept) != 1 {
		t.Fatalf("damaged database kept as %v", kept)
	}
	if _, _, err := loadAll[record](s, bucketContainers); err != nil {
		t.Fatal(err)
	}
}

// A missing database starts empty; a database whose meta pages are garbage is set aside.
func TestMissingAndGarbageDatabase(t *testing.T) {
	path, s := newTestStore(t)
	s.close()
	if err := os.WriteFile(path, []byte(strings.Repeat("garbage!", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.damage, "meta page 0") {
		t.Fatalf("damage = %q", s.damage)
	}
	s.close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	s, err = openStore(path)
	if err != nil || s.damage != "" {
		t.Fatalf("missing database: %v %q", err, s.damage)
	}
	s.close()
}

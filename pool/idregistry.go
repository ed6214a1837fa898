package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultIDRegistry is where the daemons of a host record the user namespace id ranges they
// hand out. It is host-wide on purpose (not under a state root): two daemons with different
// state roots allocate from the same layout, and each must see the other's ranges.
const DefaultIDRegistry = "/run/deltabox/idranges"

// idRegistry records which sandbox holds each host id range, host-wide: one file per range
// start ("<start>"), holding the absolute path of the holder's sandbox directory
// (<state root>/pool/containers/<cid>). Every operation runs under an exclusive flock of
// <dir>/.lock, so two daemons never take the same range. An entry is stale, and may be taken
// over, when its holder's directory no longer exists (a daemon creates that directory before
// it takes a range and removes it only after giving the range back) or when it is empty (a
// daemon that died between creating and writing it, under the lock). /run is emptied at
// boot; each daemon then records its sandboxes' ranges again when it starts (reconcile).
type idRegistry struct{ dir string }

// lock takes the registry's lock; the caller calls the returned unlock.
func (g idRegistry) lock() (func(), error) {
	if err := os.MkdirAll(g.dir, 0o700); err != nil {
		return nil, fmt.Errorf("user namespace id registry: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(g.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("user namespace id registry: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock user namespace id registry: %w", err)
	}
	return func() { f.Close() }, nil // closing drops the lock
}

func (g idRegistry) path(start uint32) string {
	return filepath.Join(g.dir, strconv.FormatUint(uint64(start), 10))
}

// holder returns who holds start ("" for nobody, or a stale entry). Under the lock.
func (g idRegistry) holder(start uint32) (string, error) {
	b, err := os.ReadFile(g.path(start))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("user namespace id registry: %w", err)
	}
	owner := strings.TrimSpace(string(b))
	if owner == "" || !filepath.IsAbs(owner) {
		return "", nil // torn by a crash under the lock, or not ours to read: stale
	}
	if _, err := os.Lstat(owner); errors.Is(err, os.ErrNotExist) {
		return "", nil // its sandbox is gone
	}
	return owner, nil
}

// take records owner as start's holder, if start is free, stale or already owner's. Under
// the lock. It returns the live holder that prevents it ("" when taken).
func (g idRegistry) take(start uint32, owner string) (string, error) {
	held, err := g.holder(start)
	if err != nil || (held != "" && held != owner) {
		return held, err
	}
	tmp := g.path(start) + ".tmp"
	if err := os.WriteFile(tmp, []byte(owner+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("user namespace id registry: %w", err)
	}
	if err := os.Rename(tmp, g.path(start)); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("user namespace id registry: %w", err)
	}
	return "", nil
}

// give removes start's entry if owner holds it. Under the lock.
func (g idRegistry) give(start uint32, owner string) error {
	b, err := os.ReadFile(g.path(start))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil && strings.TrimSpace(string(b)) != owner {
		return nil // another's (ours was taken over as stale)
	}
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		err = os.Remove(g.path(start))
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("user namespace id registry: %w", err)
	}
	return nil
}

// entries lists the registry: range start -> holder path as written (stale ones included).
// Under the lock.
func (g idRegistry) entries() (map[uint32]string, error) {
	ents, err := os.ReadDir(g.dir)
	if err != nil {
		return nil, fmt.Errorf("user namespace id registry: %w", err)
	}
	out := map[uint32]string{}
	for _, e := range ents {
		start, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(g.dir, e.Name()))
		if err == nil {
			out[uint32(start)] = strings.TrimSpace(string(b))
		}
	}
	return out, nil
}

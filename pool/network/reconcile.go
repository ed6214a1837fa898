package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// Reconcile tears down the networks of sandboxes that keep rejects: namespaces in NetNSDir and
// IP reservations in the IPAM store left by a daemon that went away. It returns the IDs it
// removed and goes on past a failing ID (the error names the first one).
func (m *Manager) Reconcile(ctx context.Context, keep func(id string) bool) ([]string, error) {
	ids, err := m.knownIDs()
	if err != nil {
		return nil, err
	}
	var removed []string
	var firstErr error
	for _, id := range ids {
		if keep(id) {
			continue
		}
		if err := m.Teardown(ctx, id); err != nil {
			log.L(ctx).Warn("reconcile sandbox network", "sandbox", id, "error", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		removed = append(removed, id)
	}
	if len(removed) > 0 {
		log.L(ctx).Info("removed leftover sandbox networks", "count", len(removed), "sandboxes", removed)
	}
	return removed, firstErr
}

// Lookup returns the attachment of a sandbox set up earlier (also by a previous daemon), from
// its IP reservation; NotFound when it has none or its namespace is gone.
func (m *Manager) Lookup(ctx context.Context, id string) (Attachment, error) {
	if err := validateID(id); err != nil {
		return Attachment{}, err
	}
	res, err := m.reservations()
	if err != nil {
		return Attachment{}, err
	}
	ip, ok := res[id]
	if _, serr := os.Stat(m.NetNSPath(id)); !ok || serr != nil {
		return Attachment{}, fmt.Errorf("network of sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return m.attachment(id, ip), nil
}

// knownIDs returns the sandbox IDs that own a namespace or an IP reservation, sorted.
func (m *Manager) knownIDs() ([]string, error) {
	ids, err := m.netnsIDs()
	if err != nil {
		return nil, err
	}
	res, err := m.reservations()
	if err != nil {
		return nil, err
	}
	for id := range res {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// netnsIDs lists the namespaces pinned under NetNSDir with this network's name prefix.
func (m *Manager) netnsIDs() ([]string, error) {
	entries, err := os.ReadDir(m.opts.NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	prefix := m.opts.NetworkName + "-"
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutPrefix(e.Name(), prefix)
		if ok && validateID(id) == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// reservations reads host-local's store: a file per reserved IP whose first line is the
// container (sandbox) ID.
func (m *Manager) reservations() (map[string]netip.Addr, error) {
	dir := filepath.Join(ipamDir(m.opts.StateDir), m.opts.NetworkName)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list IP reservations: %w", err)
	}
	out := make(map[string]netip.Addr)
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil || !e.Type().IsRegular() {
			continue // lock and last_reserved_ip files
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // released meanwhile
		}
		id, _, _ := strings.Cut(string(b), "\n")
		out[strings.TrimSpace(id)] = ip
	}
	return out, nil
}

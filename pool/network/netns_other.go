//go:build !linux

package network

import (
	"fmt"

	"github.com/containerd/errdefs"
)

func createNetNS(string, string) error {
	return fmt.Errorf("network namespaces: %w", errdefs.ErrNotImplemented)
}

func removeNetNS(string) error { return nil }

func shareNetNSDir(string) error { return nil }

//go:build !linux

package proxy

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containerd/errdefs"
)

func originalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, fmt.Errorf("transparent proxying needs Linux: %w", errdefs.ErrNotImplemented)
}

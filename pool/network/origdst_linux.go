package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// OriginalDst returns where a connection accepted on a transparent port was headed before the
// firewall redirected it (SO_ORIGINAL_DST from conntrack). For a connection that was not
// redirected it returns the local address.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var mreq *unix.IPv6Mreq // 16 bytes: exactly a struct sockaddr_in
	var serr error
	err = raw.Control(func(fd uintptr) {
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: getsockopt SO_ORIGINAL_DST: %w", err)
	}
	b := mreq.Multiaddr
	port := binary.BigEndian.Uint16(b[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
}

//go:build linux

package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// originalDst reads the pre-NAT destination of a REDIRECTed IPv4 or IPv6 TCP connection.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T is not a socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var ap netip.AddrPort
	var serr error
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	v4 := local.Addr().Unmap().Is4()
	err = raw.Control(func(fd uintptr) { ap, serr = getOriginalDst(int(fd), v4) })
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	return ap, nil
}

func getOriginalDst(fd int, v4 bool) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6 // large enough for both families
	size := uint32(unsafe.Sizeof(sa))
	level, opt := unix.SOL_IPV6, ip6tSOOriginalDst
	if v4 {
		level, opt = unix.SOL_IP, unix.SO_ORIGINAL_DST
	}
	if err := getsockopt(fd, level, opt, unsafe.Pointer(&sa), &size); err != nil {
		return netip.AddrPort{}, err
	}
	return sockaddrToAddrPort(&sa)
}

func sockaddrToAddrPort(sa *unix.RawSockaddrInet6) (netip.AddrPort, error) {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), netPort(&sa4.Port)), nil
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), netPort(&sa.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("unknown address family %d", sa.Family)
}

// netPort reads a port stored in network byte order.
func netPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}

func getsockopt(fd, level, opt int, p unsafe.Pointer, size *uint32) error {
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(p), uintptr(unsafe.Pointer(size)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80

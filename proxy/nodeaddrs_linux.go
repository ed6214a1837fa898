package proxy

import (
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"
)

// interfacePrefixes lists the addresses of every interface of the node (its network
// namespace) as they are now, with one netlink address dump (no link table: a node with
// hundreds of sandbox veths answers as fast as one without).
func interfacePrefixes() ([]netip.Prefix, error) {
	tab, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("netlink address dump: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(tab)
	if err != nil {
		return nil, fmt.Errorf("netlink address dump: %w", err)
	}
	var out []netip.Prefix
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		ifa := (*syscall.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return nil, fmt.Errorf("netlink address dump: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type != syscall.IFA_ADDRESS && a.Attr.Type != syscall.IFA_LOCAL {
				continue
			}
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				out = append(out, netip.PrefixFrom(ip.Unmap(), int(ifa.Prefixlen)))
			}
		}
	}
	return out, nil
}

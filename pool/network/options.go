package network

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"

	"github.com/containerd/errdefs"
)

// Defaults for Options.
const (
	DefaultNetworkName = "deltabox"
	DefaultBridge      = "deltabox0"
	DefaultCNIBinDir   = "/opt/cni/bin"
	DefaultNetNSDir    = "/run/netns"
)

// DefaultSubnet is the sandbox subnet when Options.Subnet is unset.
var DefaultSubnet = netip.MustParsePrefix("10.213.0.0/16")

// Options configure a Manager. Zero fields take the defaults above; StateDir and ProxyPort
// are required.
type Options struct {
	// StateDir holds the IPAM reservations (StateDir/ipam/NetworkName/<ip>).
	StateDir string
	// NetworkName names the CNI network, the netns files (NetworkName-<id>) and, upper-cased,
	// the firewall chains (DELTABOX-INPUT, ...). Lower-case letters, digits and '-', at most 15.
	NetworkName string
	// Bridge is the host bridge; it carries the gateway address (the subnet's first host).
	Bridge string
	// Subnet is the IPv4 sandbox subnet.
	Subnet netip.Prefix
	// CNIBinDir holds the bridge, host-local and loopback plugins.
	CNIBinDir string
	// NetNSDir holds the named network namespaces (bind mounts); /run/netns makes them
	// visible to `ip netns`.
	NetNSDir string
	// ProxyPort is the egress proxy's port on the gateway address (HTTP_PROXY).
	ProxyPort uint16
	// TransparentHTTPPort and TransparentHTTPSPort receive plain TCP to port 80 and 443 of any
	// address (DNAT). Zero disables that redirect: such traffic is then dropped.
	TransparentHTTPPort  uint16
	TransparentHTTPSPort uint16
	// Runner runs ip and iptables; nil runs the real binaries.
	Runner Runner
}

var (
	networkNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,14}$`)
	bridgeRE      = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_.-]{0,14}$`)
	sandboxIDRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)
)

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.NetworkName == "" {
		o.NetworkName = DefaultNetworkName
	}
	if o.Bridge == "" {
		o.Bridge = DefaultBridge
	}
	if !o.Subnet.IsValid() {
		o.Subnet = DefaultSubnet
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = DefaultCNIBinDir
	}
	if o.NetNSDir == "" {
		o.NetNSDir = DefaultNetNSDir
	}
	if o.Runner == nil {
		o.Runner = execRunner{}
	}
	return o
}

// validate checks options that already have their defaults.
func (o Options) validate() error {
	switch {
	case o.StateDir == "" || !filepath.IsAbs(o.StateDir):
		return fmt.Errorf("network state dir %q must be an absolute path: %w", o.StateDir, errdefs.ErrInvalidArgument)
	case !networkNameRE.MatchString(o.NetworkName):
		return fmt.Errorf("network name %q: want [a-z][a-z0-9-]{0,14}: %w", o.NetworkName, errdefs.ErrInvalidArgument)
	case !bridgeRE.MatchString(o.Bridge):
		return fmt.Errorf("bridge name %q is not a valid interface name: %w", o.Bridge, errdefs.ErrInvalidArgument)
	case !o.Subnet.Addr().Is4() || o.Subnet.Bits() < 8 || o.Subnet.Bits() > 29:
		return fmt.Errorf("subnet %s: want an IPv4 prefix between /8 and /29: %w", o.Subnet, errdefs.ErrInvalidArgument)
	case o.ProxyPort == 0:
		return fmt.Errorf("network needs the egress proxy's port: %w", errdefs.ErrInvalidArgument)
	case !filepath.IsAbs(o.CNIBinDir) || !filepath.IsAbs(o.NetNSDir):
		return fmt.Errorf("CNI bin dir %q and netns dir %q must be absolute: %w", o.CNIBinDir, o.NetNSDir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// gateway returns the subnet's first host address, which the bridge carries.
func gatewayOf(subnet netip.Prefix) netip.Addr {
	return subnet.Masked().Addr().Next()
}

// validateID checks that a sandbox ID is safe as a path component and a CNI container ID.
func validateID(id string) error {
	if !sandboxIDRE.MatchString(id) {
		return fmt.Errorf("sandbox id %q: want [a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

package network

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"

	gocni "github.com/containerd/go-cni"
)

// sandboxIfName is the sandbox's interface: go-cni names the first network's interface eth0.
const sandboxIfName = "eth0"

// ipamDir is where host-local keeps this network's reservations (one file per IP holding the
// sandbox ID), under Options.StateDir.
func ipamDir(stateDir string) string { return filepath.Join(stateDir, "ipam") }

// confList returns the CNI network configuration list: a bridge plugin with port isolation
// (sandboxes cannot reach each other at layer 2), no gateway role (the Manager puts the
// gateway address on the bridge itself, so the plugin never enables IP forwarding), no
// masquerade, and host-local IPAM with a default route via the gateway.
func confList(o Options) ([]byte, error) {
	gw := gatewayOf(o.Subnet)
	ipam := map[string]any{
		"type":    "host-local",
		"dataDir": ipamDir(o.StateDir),
		"ranges": [][]map[string]string{{{
			"subnet":     o.Subnet.Masked().String(),
			"rangeStart": gw.Next().String(),
			"gateway":    gw.String(),
		}}},
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       o.NetworkName,
		"plugins": []map[string]any{{
			"type":          "bridge",
			"bridge":        o.Bridge,
			"isGateway":     false,
			"ipMasq":        false,
			"hairpinMode":   false,
			"portIsolation": true,
			"ipam":          ipam,
		}},
	}
	return json.Marshal(conf)
}

// newCNI returns a go-cni instance with our network (eth0) and the loopback network (lo).
func newCNI(o Options) (gocni.CNI, error) {
	conf, err := confList(o)
	if err != nil {
		return nil, fmt.Errorf("build CNI config: %w", err)
	}
	c, err := gocni.New(
		gocni.WithPluginDir([]string{o.CNIBinDir}), // first: the others capture its invoker
		gocni.WithMinNetworkCount(2),
		gocni.WithConfListBytes(conf),
		gocni.WithLoNetwork,
	)
	if err != nil {
		return nil, fmt.Errorf("load CNI config: %w", err)
	}
	return c, nil
}

// sandboxIP returns the IPv4 address CNI gave the sandbox's eth0.
func sandboxIP(res *gocni.Result) (netip.Addr, error) {
	cfg, ok := res.Interfaces[sandboxIfName]
	if !ok {
		return netip.Addr{}, fmt.Errorf("CNI result has no %s", sandboxIfName)
	}
	for _, ipc := range cfg.IPConfigs {
		if a, ok := netip.AddrFromSlice(ipc.IP); ok && a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("CNI result has no IPv4 address on %s", sandboxIfName)
}

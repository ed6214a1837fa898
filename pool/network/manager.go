package network

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	gocni "github.com/containerd/go-cni"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// cleanupTimeout bounds cleanup that must run even when the caller's context is cancelled.
const cleanupTimeout = 30 * time.Second

// Manager sets up and tears down sandbox networks on one bridge. It is safe for concurrent
// use by different sandbox IDs.
type Manager struct {
	opts    Options
	gateway netip.Addr
	cni     gocni.CNI
	fw      *firewall
	br      *bridge
}

// New installs the firewall, then brings up the bridge with the gateway address (in that
// order, so no sandbox traffic is ever unfiltered). It is idempotent: a restarted daemon calls
// it again and keeps existing sandboxes' networks.
func New(ctx context.Context, o Options) (*Manager, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	c, err := newCNI(o)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(ipamDir(o.StateDir), 0o700); err != nil {
		return nil, fmt.Errorf("create network state dir: %w", err)
	}
	if err := shareNetNSDir(o.NetNSDir); err != nil {
		return nil, err
	}
	m := newManager(o, c)
	if err := m.Ensure(ctx); err != nil {
		return nil, err
	}
	log.L(ctx).Info("sandbox network ready", "bridge", o.Bridge, "gateway", m.gateway, "subnet", o.Subnet, "proxy_port", o.ProxyPort)
	return m, nil
}

func newManager(o Options, c gocni.CNI) *Manager {
	gw := gatewayOf(o.Subnet)
	_, err := os.Stat("/proc/sys/net/ipv6")
	return &Manager{
		opts:    o,
		gateway: gw,
		cni:     c,
		fw: &firewall{
			run: o.Runner, bridge: o.Bridge, prefix: strings.ToUpper(o.NetworkName),
			subnet: o.Subnet.Masked(), gateway: gw,
			proxy: o.ProxyPort, http: o.TransparentHTTPPort, https: o.TransparentHTTPSPort,
			ipv6: err == nil,
		},
		br: &bridge{run: o.Runner, name: o.Bridge, gateway: netip.PrefixFrom(gw, o.Subnet.Bits())},
	}
}

// Ensure re-applies the firewall, then the bridge: it rewrites DeltaBox's chains, moves its
// jumps back to the top of the host's chains if anything was inserted above them, and restores
// the bridge's address. Idempotent and cheap (a few ms); the daemon may call it periodically so
// that a host firewall reload cannot leave sandboxes unfiltered for long.
func (m *Manager) Ensure(ctx context.Context) error {
	if err := m.fw.ensure(ctx); err != nil {
		return err
	}
	return m.br.ensure(ctx)
}

// Gateway returns the bridge's address: the egress proxy must listen there.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// ProxyURL returns the URL sandboxes use as HTTP(S)_PROXY.
func (m *Manager) ProxyURL() string { return proxyURL(m.gateway, m.opts.ProxyPort) }

// Subnet is the sandbox subnet.
func (m *Manager) Subnet() netip.Prefix { return m.opts.Subnet }

// Env returns the proxy environment of the sandboxes (Attachment.Env), for a spec written
// before the sandbox is attached.
func (m *Manager) Env() []string { return m.attachment("", netip.Addr{}).Env() }

// NetNSPath returns where the sandbox's network namespace is (or would be) pinned.
func (m *Manager) NetNSPath(id string) string {
	return filepath.Join(m.opts.NetNSDir, m.opts.NetworkName+"-"+id)
}

// SetupOpt tunes Setup.
type SetupOpt func(*setupConfig)

type setupConfig struct {
	from string     // an existing network namespace to pin instead of a new one
	ip   netip.Addr // the address to ask IPAM for (zero: any free one)
}

// WithIP asks for the sandbox's address to be ip (a sandbox attached again, after its network
// namespace was remade, keeps its address: the proxy and firewall know it by it). Setup fails
// if IPAM has given ip to another sandbox meanwhile.
func WithIP(ip netip.Addr) SetupOpt {
	return func(c *setupConfig) { c.ip = ip }
}

// WithNetNSOf attaches the network namespace process pid is in instead of creating one: a
// namespace made inside a sandbox's user namespace, so that it is the sandbox's own (CRIU
// dumps a container only when its user namespace owns its network namespace). The caller
// keeps pid alive (and unreaped) until Setup returns.
func WithNetNSOf(pid int) SetupOpt {
	return func(c *setupConfig) { c.from = fmt.Sprintf("/proc/%d/ns/net", pid) }
}

// Setup creates the sandbox's network namespace (or pins the one WithNetNSOf names) and
// attaches it to the bridge. A namespace that already exists is AlreadyExists (Teardown it, or
// Reconcile after a restart). On error nothing is left behind.
func (m *Manager) Setup(ctx context.Context, id string, opts ...SetupOpt) (Attachment, error) {
	if err := validateID(id); err != nil {
		return Attachment{}, err
	}
	var cfg setupConfig
	for _, o := range opts {
		o(&cfg)
	}
	path := m.NetNSPath(id)
	if err := createNetNS(path, cfg.from); err != nil {
		return Attachment{}, fmt.Errorf("set up network of sandbox %q: %w", id, err)
	}
	att, err := m.attach(ctx, id, path, cfg.ip)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if terr := m.Teardown(cctx, id); terr != nil {
			log.L(ctx).Warn("clean up failed network setup", "sandbox", id, "error", terr)
		}
		return Attachment{}, fmt.Errorf("set up network of sandbox %q: %w", id, err)
	}
	log.L(ctx).Debug("sandbox network attached", "sandbox", id, "ip", att.IP, "netns", path)
	return att, nil
}

func (m *Manager) attach(ctx context.Context, id, path string, want netip.Addr) (Attachment, error) {
	var nsOpts []gocni.NamespaceOpts
	if want.IsValid() {
		// host-local takes the address from CNI_ARGS; the other plugins ignore it.
		nsOpts = append(nsOpts, gocni.WithArgs("IgnoreUnknown", "1"), gocni.WithArgs("IP", want.String()))
	}
	res, err := m.cni.Setup(ctx, id, path, nsOpts...)
	if err != nil {
		return Attachment{}, fmt.Errorf("CNI add: %w", classifyCNI(err))
	}
	if err := m.br.isolatePorts(res); err != nil {
		return Attachment{}, err
	}
	ip, err := sandboxIP(res)
	if err != nil {
		return Attachment{}, err
	}
	if want.IsValid() && ip != want {
		return Attachment{}, fmt.Errorf("CNI add: asked for address %s, got %s: %w", want, ip, errdefs.ErrUnavailable)
	}
	veth, mac, err := sandboxPort(res, m.opts.Bridge)
	if err != nil {
		return Attachment{}, err
	}
	if err := m.fw.bindPort(ctx, id, veth, ip, mac); err != nil {
		return Attachment{}, err
	}
	return m.attachment(id, ip), nil
}

func (m *Manager) attachment(id string, ip netip.Addr) Attachment {
	return Attachment{ID: id, NetNSPath: m.NetNSPath(id), IP: ip, Gateway: m.gateway, ProxyURL: m.ProxyURL()}
}

// Teardown detaches the sandbox (CNI DEL frees its IP) and removes its namespace. Missing
// pieces are fine, so it can be repeated and can clean up half-done setups. The container's
// task should be gone first: a process left in the namespace keeps it (and its veth) alive.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	path := m.NetNSPath(id)
	cniPath := path
	if !isNetNS(path) {
		cniPath = "" // CNI DEL without a namespace still releases the IP
	}
	if err := m.cni.Remove(ctx, id, cniPath); err != nil {
		return fmt.Errorf("tear down network of sandbox %q: CNI del: %w", id, classifyCNI(err))
	}
	if err := m.fw.unbindPort(ctx, id); err != nil { // after CNI DEL: the address is free now
		return fmt.Errorf("tear down network of sandbox %q: %w", id, err)
	}
	if err := removeNetNS(path); err != nil {
		return fmt.Errorf("tear down network of sandbox %q: %w", id, err)
	}
	log.L(ctx).Debug("sandbox network removed", "sandbox", id)
	return nil
}

// Uninstall tears down every sandbox network of this Manager, then removes the firewall
// chains and the bridge. The daemon does not call it on exit: the firewall stays so that
// sandboxes that outlive the daemon stay contained. It is for `deltabox` cleanup and tests.
func (m *Manager) Uninstall(ctx context.Context) error {
	if _, err := m.Reconcile(ctx, func(string) bool { return false }); err != nil {
		return err
	}
	if err := m.br.remove(ctx); err != nil {
		return err
	}
	return m.fw.remove(ctx)
}

// classifyCNI maps go-cni's error classes onto errdefs.
func classifyCNI(err error) error {
	switch {
	case gocni.IsCNINotInitialized(err), gocni.IsNotFound(err):
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	case gocni.IsInvalidConfig(err):
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	case strings.Contains(err.Error(), unix.ENOSPC.Error()), strings.Contains(err.Error(), unix.EDQUOT.Error()):
		// host-local found no room for its reservation under the state dir; a plugin's
		// error carries only the text.
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	}
	return err
}

// isNetNS reports whether path is a mounted network namespace; a missing path, or a stale
// file left by a crash (a plain file on the host filesystem), is not.
func isNetNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

package orchestrator

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/network"
	"github.com/deltabox/deltabox/proxy"
)

// caPath is where every sandbox finds the node CA the egress proxy signs with.
const caPath = "/.deltabox/ca.pem"

// EgressOptions configure the egress proxy (used only with sandbox networking).
type EgressOptions struct {
	UpstreamCAFile   string        // extra PEM roots for verifying upstreams (e.g. a local test CA)
	BodyLimit        int64         // largest request body journaled for a held effect
	CommitAttempts   int           // attempts per effect on commit (0: the proxy's default)
	CommitTimeout    time.Duration // bound of each attempt
	CommitBackoff    time.Duration // wait before the second attempt, doubling
	CommitBackoffMax time.Duration // cap of that wait
	MaxConnections   int           // connections one sandbox may hold open to the proxy
	HeaderTimeout    time.Duration // to send a request's headers
	BodyTimeout      time.Duration // to send a held request's body; longest pause in a passed one's
	IdleTimeout      time.Duration // a keep-alive connection idle this long is closed
}

// proxyOptions translates the egress options (zero values keep the proxy's defaults).
func (e EgressOptions) proxyOptions() []proxy.Option {
	return []proxy.Option{
		proxy.WithCommitRetry(e.CommitAttempts, e.CommitBackoff),
		proxy.WithCommitBackoffMax(e.CommitBackoffMax),
		proxy.WithCommitTimeout(e.CommitTimeout),
		proxy.WithConnLimits(proxy.ConnLimits{MaxConns: e.MaxConnections, HeaderTimeout: e.HeaderTimeout,
			BodyTimeout: e.BodyTimeout, IdleTimeout: e.IdleTimeout}),
	}
}

// startEgress starts the proxy on the sandbox network's gateway: the forward port and the two
// transparent ports the firewall redirects plain TCP 80/443 to.
func (o *Orchestrator) startEgress(ctx context.Context, nopts network.Options) error {
	opts := append([]proxy.Option{proxy.WithStateDir(filepath.Join(o.opts.Root, "proxy")), proxy.WithGateway(o.net.Gateway())},
		o.opts.Egress.proxyOptions()...)
	if o.opts.Metrics != nil {
		opts = append(opts, proxy.WithRegisterer(o.opts.Metrics))
	}
	if f := o.opts.Egress.UpstreamCAFile; f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("egress upstream CA: %w", err)
		}
		opts = append(opts, proxy.WithUpstreamRootsPEM(pem))
	}
	if n := o.opts.Egress.BodyLimit; n > 0 {
		opts = append(opts, proxy.WithBodyLimit(n))
	}
	p, err := proxy.New(opts...)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	gw := o.net.Gateway()
	if err := o.listenEgress(ctx, p, gw, nopts); err != nil {
		p.Close()
		return err
	}
	o.proxy = p
	o.effects = proxyEffects{p: p}
	// Commits the proxy began for an earlier version (whose commit point was not recorded
	// first) are finished in the background: a hung upstream must not keep the API down.
	// The sessions resume their own recorded commits (recover).
	go func(ctx context.Context) {
		if err := p.ResumeCommits(ctx); err != nil {
			log.L(ctx).Error("resume interrupted commits", "error", err)
		}
	}(context.WithoutCancel(ctx))
	share := filepath.Join(o.opts.Root, shareDir)
	if err := os.MkdirAll(share, 0o755); err != nil {
		return err
	}
	// Rewritten in place, and only when it changed: running sandboxes bind-mount this inode,
	// and CRIU cannot restore a bind mount whose source was replaced (it sees it deleted).
	ca := filepath.Join(share, "ca.pem")
	if cur, err := os.ReadFile(ca); err == nil && bytes.Equal(cur, p.CACertPEM()) {
		return nil
	}
	return os.WriteFile(ca, p.CACertPEM(), 0o644)
}

// shareDir (under the state root) holds the public files bind-mounted into sandboxes (the
// egress CA's certificate), readable by the sandboxes' roots: a CRIU restore in a user
// namespace opens a bind-mount source as the sandbox's root. The proxy's own directory,
// with the CA's key, stays 0700.
const shareDir = "share"

func (o *Orchestrator) listenEgress(ctx context.Context, p *proxy.Proxy, gw netip.Addr, n network.Options) error {
	type port struct {
		n     uint16
		serve func(context.Context, net.Listener) error
	}
	for _, pt := range []port{{n.ProxyPort, p.Serve}, {n.TransparentHTTPPort, p.ServeTransparent}, {n.TransparentHTTPSPort, p.ServeTransparent}} {
		if pt.n == 0 {
			continue
		}
		l, err := net.Listen("tcp", netip.AddrPortFrom(gw, pt.n).String())
		if err != nil {
			return fmt.Errorf("egress proxy listener: %w", err)
		}
		o.closers = append(o.closers, l.Close)
		go pt.serve(ctx, l)
	}
	return nil
}

// sandboxSpec adds what every sandbox container needs from the orchestrator: the node CA (and
// the variables that make clients trust it), the CRIU configuration file and the SDKs.
func (o *Orchestrator) sandboxSpec(cid, dir string) ([]oci.SpecOpts, error) {
	opts, err := o.criuSpec(cid, dir)
	if err != nil {
		return nil, err
	}
	if o.sdkDir != "" {
		opts = append(opts, sdkSpec(o.sdkDir)...)
	}
	if o.proxy == nil {
		return opts, nil
	}
	ca := filepath.Join(o.opts.Root, shareDir, "ca.pem")
	return append(opts,
		oci.WithMounts([]specs.Mount{{Destination: caPath, Type: "bind", Source: ca, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}}),
		oci.WithEnv([]string{"SSL_CERT_FILE=" + caPath, "REQUESTS_CA_BUNDLE=" + caPath, "NODE_EXTRA_CA_CERTS=" + caPath, "CURL_CA_BUNDLE=" + caPath}),
	), nil
}

// registerEgress tells the proxy which sandbox speaks from which address, with its policy.
func (o *Orchestrator) registerEgress(ctx context.Context, sb pool.Sandbox) error {
	if o.proxy == nil || sb.IP == "" {
		return nil
	}
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return err
	}
	var policy *proxy.Policy
	if sb.EgressPolicy != "" {
		if policy, err = proxy.ParsePolicy([]byte(sb.EgressPolicy)); err != nil {
			return err
		}
	}
	return o.proxy.RegisterSandbox(ip, proxy.SandboxConfig{ID: sb.ID, Policy: policy})
}

// expectEffects tells the proxy the journal watermark the sandbox's latest checkpoint
// recorded: a journal that lost effects (missing or cut short) is marked damaged and its
// commits are refused.
func (o *Orchestrator) expectEffects(ctx context.Context, id string, wm uint64) {
	if o.proxy == nil {
		return
	}
	if err := o.proxy.ExpectWatermark(ctx, id, wm); err != nil {
		log.L(ctx).Error("effect journal lost effects", "sandbox", id, "error", err)
	}
}

func (o *Orchestrator) unregisterEgress(sb pool.Sandbox) {
	if o.proxy == nil || sb.IP == "" {
		return
	}
	if ip, err := netip.ParseAddr(sb.IP); err == nil {
		o.proxy.UnregisterSandbox(ip)
	}
}

// ValidatePolicy checks an egress policy document.
func ValidatePolicy(doc string) error {
	if doc == "" {
		return nil
	}
	_, err := proxy.ParsePolicy([]byte(doc))
	return err
}

// proxyEffects adapts the egress proxy to the checkpoint protocol's Effects.
type proxyEffects struct{ p *proxy.Proxy }

func (e proxyEffects) SetCheckpoint(ctx context.Context, sandbox, ckpt string) error {
	return e.p.SetCheckpoint(ctx, sandbox, ckpt)
}

func (e proxyEffects) Watermark(sandbox string) uint64 { return e.p.Watermark(sandbox) }

func (e proxyEffects) Rollback(ctx context.Context, sandbox string, wm uint64) (int, error) {
	dropped, compensated, err := e.p.Rollback(ctx, sandbox, wm)
	if compensated > 0 {
		log.L(ctx).Info("effects compensated", "sandbox", sandbox, "count", compensated)
	}
	return dropped + compensated, err
}

func (e proxyEffects) Commit(ctx context.Context, sandbox string, upto uint64) (int, int, error) {
	if upto == 0 {
		return 0, 0, nil // nothing was journaled before the commit point
	}
	res, err := e.p.CommitTo(ctx, sandbox, upto)
	return res.Released, res.Failed, err
}

func (e proxyEffects) List(_ context.Context, sandbox string, from, to uint64) ([]api.Effect, error) {
	var out []api.Effect
	for _, x := range e.p.Effects(sandbox) {
		if x.Seq <= from || (to != 0 && x.Seq > to) {
			continue
		}
		out = append(out, apiEffect(x))
	}
	return out, nil
}

// requestDetailer is the optional part of Effects that shows an effect's request.
type requestDetailer interface {
	Request(sandbox, effect string) (api.EffectRequest, error)
}

func (e proxyEffects) Request(sandbox, effect string) (api.EffectRequest, error) {
	d, err := e.p.EffectRequest(sandbox, effect)
	if err != nil {
		return api.EffectRequest{}, err
	}
	out := api.EffectRequest{Headers: map[string][]string(d.Header), Bytes: len(d.Body), Compacted: d.Compacted}
	if out.Headers == nil {
		out.Headers = map[string][]string{}
	}
	if utf8.Valid(d.Body) {
		out.Body = string(d.Body)
	} else {
		out.BodyBase64 = d.Body
	}
	return out, nil
}

func (e proxyEffects) Forget(_ context.Context, sandbox string) error {
	return e.p.RemoveSandbox(sandbox)
}

// heldCarrier is the Effects that can carry held effects through a snapshot (the proxy).
type heldCarrier interface {
	ExportHeld(ctx context.Context, sandbox string, upto uint64) ([]byte, error)
	AdoptHeld(ctx context.Context, sandbox string, data []byte) (int, error)
}

func (e proxyEffects) ExportHeld(ctx context.Context, sandbox string, upto uint64) ([]byte, error) {
	return e.p.ExportHeld(ctx, sandbox, upto)
}

func (e proxyEffects) AdoptHeld(ctx context.Context, sandbox string, data []byte) (int, error) {
	return e.p.AdoptHeld(ctx, sandbox, data)
}

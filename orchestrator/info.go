package orchestrator

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/version"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// Info reports the daemon, its dependencies and the host.
func (o *Orchestrator) Info(ctx context.Context) (api.Info, error) {
	info := api.Info{
		Node:       o.node,
		Daemon:     api.Component{Version: version.Version, Commit: version.Commit},
		Containerd: o.containerdInfo(ctx),
		Runc:       runcInfo(ctx),
		CRIU: api.CRIU{
			Path: o.criu.Path, Version: o.criu.VersionString(), CheckPassed: o.criu.CheckPassed,
			CheckOutput: o.criu.CheckOutput, L3Available: o.criu.Available, Reason: o.criu.Reason,
		},
		Host:      o.hostInfo(),
		StateRoot: o.opts.Root,
		Namespace: o.opts.Namespace,
		Store:     api.ObjectStore{URI: o.opts.ObjectStoreURI},
		Sandbox: api.SandboxDefaults{Isolation: apiIsolation(pool.SandboxIsolation()), Limits: apiLimits(o.opts.SandboxDefaults),
			IDRangeFirst: pool.IDRangeFirst, IDRangeSize: pool.IDRangeSize},
		Snapshots: api.SnapshotTrust{SigningKey: snapsign.Fingerprint(o.signer.Public()),
			PublicKey: snapsign.Inline(o.signer.Public()), Trusted: o.trust.Trusted()},
	}
	if o.net != nil {
		info.Network = &api.Network{Subnet: o.net.Subnet().String(), Gateway: o.net.Gateway().String(), Proxy: o.net.ProxyURL()}
	}
	info.RemoteAPI = o.remoteAPI.Load()
	return info, nil
}

// SetRemoteAPI records the host API's TCP listener for Info.
func (o *Orchestrator) SetRemoteAPI(r api.RemoteAPI) { o.remoteAPI.Store(&r) }

func (o *Orchestrator) containerdInfo(ctx context.Context) api.Containerd {
	c := api.Containerd{Address: o.opts.ContainerdAddress}
	v, err := o.client.Version(ctx)
	if err != nil {
		c.Error = err.Error()
		return c
	}
	c.Reachable, c.Version, c.Revision = true, v.Version, v.Revision
	return c
}

func runcInfo(ctx context.Context) api.Component {
	path, err := exec.LookPath("runc")
	if err != nil {
		return api.Component{Error: err.Error()}
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return api.Component{Path: path, Error: err.Error()}
	}
	// "runc version 1.5.3\ncommit: ...\nspec: ..."
	first, _, _ := strings.Cut(string(out), "\n")
	return api.Component{Path: path, Version: strings.TrimPrefix(first, "runc version ")}
}

func (o *Orchestrator) hostInfo() api.Host {
	h := api.Host{Arch: runtime.GOARCH, CgroupMode: cgroupMode(), Overlayfs: hasFilesystem("overlay")}
	switch err := overlay.TrackingAvailable(); {
	case o.opts.WalkUpperDirs:
		h.ChangeTracking = "walk: checkpoints.track_changes is false"
	case err != nil:
		h.ChangeTracking = "walk: " + err.Error()
	default:
		h.ChangeTracking = "fanotify"
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return h
}

func cgroupMode() string {
	switch cgroups.Mode() {
	case cgroups.Legacy:
		return "v1"
	case cgroups.Hybrid:
		return "hybrid"
	case cgroups.Unified:
		return "v2"
	}
	return "unavailable"
}

func hasFilesystem(name string) bool {
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

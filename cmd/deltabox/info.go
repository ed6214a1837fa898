package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/version"
	"github.com/deltabox/deltabox/orchestrator/api"
)

type infoResult struct {
	Client api.Component `json:"client"`
	api.Info
}

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:  "info",
		Usage: "show the daemon, containerd, runc, CRIU and host features",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 0, ""); err != nil {
				return err
			}
			info, err := newClient(c).Info(c.Context)
			if err != nil {
				return err
			}
			res := infoResult{Client: api.Component{Version: version.Version, Commit: version.Commit}, Info: info}
			return printResult(c, res, func(w io.Writer) { printInfo(w, res) })
		},
	}
}

func printInfo(w io.Writer, r infoResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s:\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("Client", "%s (%s)", r.Client.Version, r.Client.Commit)
	row("Daemon", "%s (%s)", r.Daemon.Version, r.Daemon.Commit)
	ctr := "unreachable: " + r.Containerd.Error
	if r.Containerd.Reachable {
		ctr = "reachable, " + r.Containerd.Version + " (" + r.Containerd.Revision + ")"
	}
	row("Containerd", "%s at %s, namespace %s", ctr, r.Containerd.Address, r.Namespace)
	row("Runc", "%s%s", r.Runc.Version, r.Runc.Error)
	row("CRIU", "%s %s", r.CRIU.Version, r.CRIU.Path)
	row("CRIU check", "%s", passed(r.CRIU.CheckPassed, r.CRIU.Reason))
	row("L3 checkpoints", "%s", available(r.CRIU.L3Available, r.CRIU.Reason))
	row("Kernel", "%s (%s)", r.Host.Kernel, r.Host.Arch)
	row("Cgroups", "%s", r.Host.CgroupMode)
	row("Overlayfs", "%t", r.Host.Overlayfs)
	row("Change tracking", "%s", r.Host.ChangeTracking)
	row("State root", "%s", r.StateRoot)
	row("Node", "%s", r.Node)
	row("Object store", "%s", r.Store.URI)
	if n := r.Network; n != nil {
		row("Sandbox network", "%s, the host (gateway) at %s", n.Subnet, n.Gateway)
		row("Egress proxy", "%s (HTTP_PROXY and HTTPS_PROXY of every sandbox)", n.Proxy)
	} else {
		row("Sandbox network", "none (sandboxes have loopback only)")
	}
	if ra := r.RemoteAPI; ra != nil {
		row("Remote API", "https://%s (certificate %s, SHA-256 %s; client certificates: %t)", ra.Address, ra.Certificate, ra.TLSFingerprint, ra.ClientCertificates)
	}
	iso := r.Sandbox.Isolation
	row("Sandbox seccomp", "%s", orNone(iso.Seccomp))
	row("Sandbox user namespace", "%t (by default; a pool may opt out; each sandbox gets its own range of %d host ids from %d)",
		iso.UserNamespace, r.Sandbox.IDRangeSize, r.Sandbox.IDRangeFirst)
	row("Sandbox capabilities", "%s", strings.Join(iso.Capabilities, " "))
	row("Sandbox default limits", "%s", limitsText(r.Sandbox.Limits))
	row("Snapshot key", "%s (%s); trusted: %d", r.Snapshots.SigningKey, r.Snapshots.PublicKey, len(r.Snapshots.Trusted))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// limitsText renders limits as "cpus 1, memory 1GiB, pids 1024, disk 10GiB".
func limitsText(l api.Limits) string {
	size := func(n int64) string {
		if n == 0 {
			return "unlimited"
		}
		return units.BytesSize(float64(n))
	}
	cpus, pids := "unlimited", "unlimited"
	if l.CPUs > 0 {
		cpus = strconv.FormatFloat(l.CPUs, 'g', -1, 64)
	}
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	return fmt.Sprintf("cpus %s, memory %s, pids %s, disk %s", cpus, size(l.MemoryBytes), pids, size(l.DiskBytes))
}

func passed(ok bool, reason string) string {
	if ok {
		return "passed"
	}
	return "failed: " + reason
}

func available(ok bool, reason string) string {
	if ok {
		return "available"
	}
	return "unavailable: " + reason
}

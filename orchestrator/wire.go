package orchestrator

import (
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/initproto"
	"time"
)

// The API owns its wire types (orchestrator/api links nothing of the daemon); these turn the
// pool's types into them and back at the HTTP boundary. wire_test.go checks that both sides
// carry the same JSON fields. Lists are never nil, so they travel as [] (never null).

func poolTemplate(t api.Template) pool.Template {
	return pool.Template{Name: t.Name, Image: t.Image, CPUs: t.CPUs, MemoryBytes: t.MemoryBytes, Pids: t.Pids, DiskBytes: t.DiskBytes,
		Env: t.Env, Workdir: t.Workdir, Labels: t.Labels, EgressPolicy: t.EgressPolicy, MinReady: t.MinReady, Max: t.Max,
		NoUserNamespace: t.NoUserNamespace, CheckpointProcesses: t.CheckpointProcesses}
}

func apiTemplate(t pool.Template) api.Template {
	return api.Template{Name: t.Name, Image: t.Image, CPUs: t.CPUs, MemoryBytes: t.MemoryBytes, Pids: t.Pids, DiskBytes: t.DiskBytes,
		Env: t.Env, Workdir: t.Workdir, Labels: t.Labels, EgressPolicy: t.EgressPolicy, MinReady: t.MinReady, Max: t.Max,
		NoUserNamespace: t.NoUserNamespace, CheckpointProcesses: t.CheckpointProcesses}
}

func apiPoolInfo(p pool.PoolInfo) api.PoolInfo {
	return api.PoolInfo{Template: apiTemplate(p.Template), Ready: p.Ready, Creating: p.Creating, Leased: p.Leased,
		Limits: apiLimits(p.Limits), Isolation: apiIsolation(p.Isolation)}
}

func apiLimits(l pool.Limits) api.Limits {
	return api.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

func apiIsolation(i pool.Isolation) api.Isolation {
	out := api.Isolation{Seccomp: i.Seccomp, Capabilities: i.Capabilities, UserNamespace: i.UserNamespace}
	if m := i.IDMapping; m != nil {
		out.IDMapping = &api.IDMapping{ContainerID: m.ContainerID, HostID: m.HostID, Size: m.Size}
	}
	return out
}

func apiPoolInfos(ps []pool.PoolInfo) []api.PoolInfo {
	out := make([]api.PoolInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, apiPoolInfo(p))
	}
	return out
}

func apiSandbox(s pool.Sandbox) api.Sandbox {
	return api.Sandbox{ID: s.ID, Pool: s.Pool, Container: s.Container, Image: s.Image, Env: s.Env, Labels: s.Labels,
		Workdir: s.Workdir, LeasedAt: s.LeasedAt, Created: s.Created, InitPid: s.InitPid, IP: s.IP, EgressPolicy: s.EgressPolicy,
		RestoredFrom: s.RestoredFrom, ForkedFrom: s.ForkedFrom, State: s.State, Reason: s.Reason,
		Limits: apiLimits(s.Limits), Isolation: apiIsolation(s.Isolation)}
}

func apiSandboxes(sbs []pool.Sandbox) []api.Sandbox {
	out := make([]api.Sandbox, 0, len(sbs))
	for _, s := range sbs {
		out = append(out, apiSandbox(s))
	}
	return out
}

func apiLeaseResult(r pool.LeaseResult) api.LeaseResult {
	return api.LeaseResult{Sandbox: apiSandbox(r.Sandbox), Cold: r.Cold}
}

func apiExitStatus(s initproto.ExitStatus) api.ExitStatus {
	return api.ExitStatus{Code: s.Code, Signal: s.Signal, TimedOut: s.TimedOut, StdoutTruncated: s.StdoutTruncated,
		StderrTruncated: s.StderrTruncated, Error: s.Error, Pid: s.Pid, DurationMS: float64(s.Duration) / float64(time.Millisecond)}
}

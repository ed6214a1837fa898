package pool

import (
	"slices"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SeccompProfile names the seccomp profile every sandbox runs under: containerd's default
// profile, the same allow-list as Docker's default (no keyctl, add_key, request_key, no
// unshare/setns/mount without CAP_SYS_ADMIN, no bpf, no io_uring, no AF_ALG/AF_VSOCK
// sockets, clone3 answers ENOSYS), computed from the capabilities below.
const SeccompProfile = "containerd-default"

// sandboxCaps are the capabilities of a sandbox's processes (bounding, effective and
// permitted): Docker's default set without CAP_NET_RAW, so no raw or packet sockets (no ping,
// no ARP or IP spoofing on the bridge). Nothing that reaches the host or other sandboxes:
// no CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_NET_ADMIN, CAP_SYS_MODULE, CAP_DAC_READ_SEARCH.
var sandboxCaps = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_MKNOD",
	"CAP_NET_BIND_SERVICE",
	"CAP_SETFCAP",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// Isolation is what confines a sandbox's processes, as `inspect` and `info` show it.
type Isolation struct {
	Seccomp       string   `json:"seccomp"`        // seccomp profile name ("" = none)
	Capabilities  []string `json:"capabilities"`   // bounding = effective = permitted set
	UserNamespace bool     `json:"user_namespace"` // root in the sandbox is not root on the host
	// IDMapping is a sandbox's user namespace mapping (uids and gids alike); nil for a pool
	// and for a sandbox without a user namespace.
	IDMapping *IDMapping `json:"id_mapping,omitempty"`
}

// SandboxIsolation returns the isolation every sandbox of this build gets by default (a pool
// may opt out of the user namespace: PoolIsolation).
func SandboxIsolation() Isolation {
	return Isolation{Seccomp: SeccompProfile, Capabilities: slices.Clone(sandboxCaps), UserNamespace: true}
}

// PoolIsolation is the isolation of t's sandboxes.
func PoolIsolation(t *Template) Isolation {
	i := SandboxIsolation()
	i.UserNamespace = !t.NoUserNamespace
	return i
}

// isolationOf is the isolation of one sandbox: its pool's, and its own id mapping.
func isolationOf(t *Template, inst *instance) Isolation {
	i := PoolIsolation(t)
	i.UserNamespace = inst.ids != nil // the sandbox's own, whatever its pool says now
	if inst.ids != nil {
		m := *inst.ids
		i.IDMapping = &m
	}
	return i
}

// isolationSpec sets a private cgroup namespace (the sandbox sees its own cgroup as
// /sys/fs/cgroup, not the host's tree), the capabilities and then the seccomp profile (which
// depends on them: a capability re-allows the syscalls it guards).
func isolationSpec() []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}),
		oci.WithCapabilities(slices.Clone(sandboxCaps)),
		seccomp.WithDefaultProfile(),
	}
}

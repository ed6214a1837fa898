// Package pool keeps warm containerd sandboxes for DeltaBox: it creates, starts, execs in,
// kills and destroys sandboxes on containerd, keeps min_ready of each pool's template
// running, hands them out on lease in O(1) and takes them back on release, and reconciles
// its records with containerd after a daemon restart.
//
// Each sandbox's PID 1 is deltabox-init (pool/initd), bind-mounted read-only; commands run
// through its unix socket (pool/initproto) rather than runc exec. Everything a sandbox can
// write, its run directory and its root filesystem, is treated as hostile by this package.
//
// pool does not know about checkpoints, agent state or egress: the orchestrator layers
// those on top through the hooks in Options.
package pool

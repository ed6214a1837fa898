// Package criu owns process checkpoint/restore with CRIU (L3 checkpoints): feature checks at
// daemon start, dumps and restores, and the packaging of CRIU images. Feature checks shell out
// to the criu binary through a small Runner so unit tests can fake it, and talk CRIU's RPC
// through github.com/checkpoint-restore/go-criu/v7; dumps and restores go through
// containerd's runc shim (containerd -> shim -> runc -> CRIU), which keeps the shim's view of
// the task right. It knows nothing about sandboxes or pools.
//
// # Dump
//
// Checkpointer.Dump calls task.Checkpoint with an explicit image path (and work path, so CRIU's
// dump.log and stats-dump stay in the images directory) and without the exit option: the task
// keeps running, and nothing is written to containerd's content store. containerd's client
// pauses the task (runc pause) around the dump unless runc already reports it paused. The L3
// flow (orchestrator/l3.go) parks the init's listener, pauses the task itself through the pool,
// dumps, captures the upper dir and saves the state document, then resumes it, so the processes
// do not run between the dump and the capture (it does not freeze the cgroup behind runc's back
// for an L3 dump, as it does for L1/L2 checkpoints). Driving runc or CRIU directly would save
// the gRPC/ttrpc hops (a few ms) but not CRIU's own frozen window, which dominates it: most of
// that window is the memory dump, CRIU's network lock/unlock (nftables, in CRIU itself: hack/
// builds CRIU with NETWORK_LOCK_DEFAULT=NETWORK_LOCK_NFTABLES, where iptables ran
// iptables-restore in the sandbox netns twice, ~60 ms of a dump and of a restore) and the
// tar+gzip of each tmpfs mount (/dev, /dev/shm, /run and the masked-path tmpfs mounts). BenchmarkDumpRestore measures a dump and restore of a python process with 50
// MiB of heap against `ctr c checkpoint`/`ctr c restore`; docs/benchmarks.md has the end-to-end
// figures (l3-frozen, l3-restore).
//
// # The node's CRIU state
//
// Two things make every CRIU run on a node cheaper and harmless to the node; the daemon does
// both at start, and CRIU works (slower, and resetting the node's cgroup2 flags) without
// them. PrepareCgroupYard binds each cgroup hierarchy's root under DefaultCgroupYard, which
// Options.CgroupYard names in every configuration: CRIU then uses those mounts instead of
// mounting each hierarchy afresh, and a fresh cgroup2 mount in the initial cgroup namespace
// would set the node's cgroup2 flags (favordynmods, nsdelegate) to none. PrimeKdatCache makes
// sure KdatCache holds CRIU's kernel-features probe, which CRIU writes itself only where /run
// is a tmpfs; without it every run probes the kernel (~30 ms). Together: a restore of 50 MiB
// of heap in CRIU 128 -> 82 ms (docs/benchmarks.md).
//
// # CRIU options
//
// containerd's shim forwards only the image, work and parent paths on restore, so CRIU
// options travel in a configuration file: WriteConfig writes one and WithConfig puts the
// ConfigAnnotation ("org.criu.config") naming it on the container's spec at create time. runc
// hands the file to CRIU on every dump and restore of that container (without the annotation
// it uses /etc/criu/runc.conf; CRIU ignores a missing file), and the file overrides the RPC
// options. A container created for a restore must carry the annotation before Restore.
//   - tcp-established: in-place restores that keep the sandbox's IP address.
//   - tcp-close: restores under a new identity (new container ID, another node, new IP).
//   - file-locks: needed to dump a process holding flock/POSIX locks at all; on restore a
//     config without it drops the locks silently, so Restore refuses such images then.
//   - network-lock cannot be set in the file: CRIU 4.1.1 segfaults in RPC mode when it is (its
//     option parser reads argv, which RPC mode has not); the lock is CRIU's build default
//     (nftables, TestDumpLocksTheNetworkWithNftables), and a restore uses its dump's.
//
// # Restore
//
// Checkpointer.Restore creates and starts a task from an images directory: the container must
// exist without a task, its rootfs must hold the dumped processes' open and mapped files with
// the same size (the orchestrator applies the rootfs diff first), and a container other than
// the dumped one must have its own cgroupsPath (containerd's default /<namespace>/<id>; a
// spec copied from the dumped container, as `ctr c restore` does, keeps the old cgroup, and
// Restore refuses it). The runtime spec's bind mounts (the init binary mounted read-only, the
// run directory mounted read-write) are external mounts for runc and are re-bound to the new
// container's sources, so a restored init listens again on its socket in the run directory.
// CRIU restores the UTS namespace from the images: the hostname is the dumped one.
// containerd's shim runs CRIU in the task's Start, not in NewTask. With WithLazyPages a
// restore where the processes may make a userfaultfd (LazyUsable) is lazy: a `criu lazy-pages`
// server on hard links of the images fills their anonymous memory after they run, and the
// container's configuration file carries "lazy-pages" from before NewTask until Start returned
// (lazy_linux.go).
//
// # Packaging
//
// Pack writes an images directory as a deterministic tar + zstd stream with MetaFile first;
// Unpack extracts it, refusing paths outside the target, links, devices and other special
// files. CheckCompatible refuses images from a newer CRIU, another architecture or another page
// size before CRIU sees them.
//
// # Pre-dump check
//
// Dump first runs Precheck on the (paused) task's process tree, read from /proc: shapes that
// CRIU would dump but not restore, or fail to dump with an obscure error, are refused with
// errdefs.ErrFailedPrecondition naming the process (see docs/l3-process-shapes.md). After the
// dump it re-arms periodic timers that expired while the task was frozen (CRIU would restore
// them disarmed) and records in Meta whether all TCP connections ran over loopback, which
// NewIdentityOptions uses to keep them established under a new identity.
//
// # Limitations
//
//   - No pre-dump or incremental memory dumps: soft-dirty tracking is off on the target
//     kernels, so every dump writes all memory.
//   - Processes with inotify watches on overlayfs cannot be dumped by CRIU <= 4.2 (file
//     watchers in node, IDEs, ...): Dump refuses them with ErrInotifyOverlay.
//   - CRIU < 4.2 cannot restore a path-bound unix socket in a process it forks a session or
//     group helper from: Dump refuses that with ErrHelperWithUnixSocket. The sandbox init,
//     which every daemonized process is reparented to, must therefore be parked (its
//     listener closed, see initproto.OpPark) during the dump; the caller does that.
//   - CRIU < 4.2 cannot dump TCP or UDP sockets on Linux >= 6.16: Dump refuses them with
//     ErrInetSockets (InetSocketsDumpable probes the kernel).
//   - A unix connection from the host into the sandbox (e.g. a client of the init socket)
//     open during a dump is an external unix socket: CRIU fails the dump. Close host
//     connections first (the ext-unix-sk option would dump them, but they come back broken).
//     Connections between sandbox processes are fine.
//   - Established TCP connections need tcp-established (same IP, or loopback only) or
//     tcp-close (new identity); never restore tcp-established connections to peers outside
//     the sandbox into a clone.
//   - Open files must match in size on restore: capture the rootfs while the task is frozen.
package criu

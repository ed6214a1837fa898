// Package proctpl keeps process templates: stopped copy-on-write forks of a sandbox's
// processes, made from outside through ptrace without the process's cooperation, from which
// fresh running copies are forked later (a rollback of process memory in about a
// millisecond, where a CRIU restore takes hundreds).
//
// # Mechanism
//
// All ptrace requests run on one dedicated, locked OS thread (the Tracer): ptrace ties a
// tracee to the thread that attached it, and templates are traced for their whole life.
// Stop seizes a process (PTRACE_SEIZE with EXITKILL, TRACEFORK and TRACECLONE) and
// interrupts it (PTRACE_INTERRUPT); its registers are saved normalized the way CRIU's compel
// does: a system call interrupted with a restart code is rewound (ip -= 2, ax = the call
// number, or restart_syscall for ERESTART_RESTARTBLOCK), so that whoever resumes from the
// saved registers re-enters the call. A fork is injected at a syscall instruction found in the
// process's vDSO (any process, even one that makes no system calls): the registers are set to
// clone(CLONE_PARENT|SIGCHLD) at that address, the call runs under PTRACE_SINGLESTEP (one
// stop, at the single-step trap the kernel forces on the call's return, which the tracer
// takes and never delivers; under PTRACE_SYSCALL, a stop at entry and one at exit, for a
// process that blocks or ignores SIGTRAP, whose signal state the forced trap would reset),
// and the child, auto-attached and stopped, gets the saved registers. That child is the template:
// it shares every page with the original copy-on-write and is kept stopped by the tracer. It
// is born non-dumpable (the original is made non-dumpable for the clone by injected prctls
// and gets its flag back at once: the sandbox runs while templates are made, and a template
// dumpable for an instant could have its memory file opened and kept), so that a process of
// the sandbox without CAP_SYS_PTRACE can neither read nor write its memory through /proc or
// attach to it; it is
// already traced, so nothing else can trace it; signals other than SIGKILL stop at the tracer
// and are never delivered. SIGKILL does kill it: a sandbox can destroy its own templates
// (Alive reports it), never change one. Copy injects the same clone into the template, gives
// the child the saved registers, restores its dumpable flag and detaches it: it runs from the
// state of the checkpoint, and the template stays for the next copy.
//
// The fork is most of a copy's cost (it copies the page tables: ~1-2 ms for 50 MB of heap
// here), so Prefork makes the next copy ahead, off the rollback's critical path: a spare,
// forked from the template and kept stopped and non-dumpable like it. Copy then only gives
// the spare its dumpable flag and file offsets and detaches it. A spare the sandbox killed is
// noticed by Copy, which forks anew.
//
// A Tracer is one thread; a caller may run several (one per core) and spread the processes
// of one checkpoint over them, so that their templates and copies are made in parallel.
//
// # Limits (by construction)
//
//   - One thread: fork copies only the calling thread. Multi-threaded processes are refused
//     (ErrMultiThreaded); the caller falls back to CRIU.
//   - Parents: CLONE_PARENT makes the template, and every copy, a child of the original's
//     parent at that moment. A copy of a process whose parent is another templated process
//     becomes a child of the sandbox's init once the parent is killed, not of the parent's
//     copy: the parent's copy cannot wait(2) for it.
//   - PIDs: a copy has a new pid. Pids stored in memory (a shell's $$ and job table, pid
//     files) name the old processes.
//   - Shared file descriptions: the template's fds are the original's (dup'd by fork), so
//     file offsets, pipes and sockets are shared with the original and every copy. Data
//     buffered in a pipe at the checkpoint and read since is not put back; the offsets of
//     regular files are put back by Copy (an injected lseek per fd) from what Wait read in
//     /proc/PID/fdinfo.
//   - Architecture: x86-64 only (64-bit processes).
//
// # Huge pages
//
// CollapseHuge collapses the dense, exclusively mapped private memory of a process into huge
// pages before its first template (huge_linux.go says why and what it leaves alone): a fork
// then copies one page-table entry per 2 MiB instead of 512.
//
// # Lifetime
//
// Every tracee is seized with PTRACE_O_EXITKILL: if the daemon dies (even with SIGKILL) the
// kernel kills its templates, so no stopped template outlives the daemon that made it. A
// seized process that does not stop within StopTimeout is given up (Wait fails) and let go
// as soon as it stops, so one stuck process never holds the tracer thread.
package proctpl

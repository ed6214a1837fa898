//go:build !cli

package main

import "runtime"

// init keeps the main goroutine on the process's first thread (the daemon's build only: in
// the light client it would start the runtime's template thread at every call). The daemon
// moves locked threads into sandboxes' network namespaces and lets them end there; had one
// of those goroutines run on the first thread, the runtime would park that thread in the
// sandbox's namespace for good, and everything that reads the process's namespace through
// /proc/<pid> (ip, ss, CRIU's view of the daemon) would see the sandbox's instead.
func init() {
	runtime.LockOSThread()
}

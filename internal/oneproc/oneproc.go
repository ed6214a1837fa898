// Package oneproc runs the process on one P (GOMAXPROCS=1) from its package initialiser on.
// It is for the CLI build only (cmd/deltabox/lite_cli.go imports it): a call that makes one
// request and exits gains nothing from a second P, and pays for one in page faults, since
// each P allocates from spans of its own (~50 of ~440 faults of `deltabox lease` on a VM
// where a fault costs ~30 us). It imports only runtime and syscall, so that it initialises
// before most packages that allocate. GOMAXPROCS in the environment still wins.
package oneproc

import (
	"runtime"
	"syscall"
)

func init() {
	if _, set := syscall.Getenv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
}

//go:build cgo

package main

// #include "cfront.h"
import "C"

import (
	"syscall"
	"unsafe"
)

// cFront is what the C front (cfront.c) left for Go when it sent a call's request and met
// something it does not fully know; nil when it sent nothing. It reads C's globals (no cgo
// call: C.GoBytes copies in Go).
func cFront() *fromC {
	h := C.cfront_h
	if h.kind == C.CFRONT_NONE {
		return nil
	}
	return &fromC{
		kind:    int(h.kind),
		fd:      int(h.fd),
		errno:   syscall.Errno(h.err),
		readErr: syscall.Errno(h.read_err),
		raw:     C.GoBytes(unsafe.Pointer(h.raw), C.int(h.rawlen)),
		pending: C.GoBytes(unsafe.Pointer(h.pending), C.int(h.pendlen)),
		left:    int64(h.left),
		crlf:    h.crlf != 0,
	}
}

//go:build !cgo

package main

// cFront: without cgo there is no C front (cfront.c), and Go runs every call.
func cFront() *fromC { return nil }

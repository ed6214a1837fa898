//go:build !cli

package main

// keepArgs is a no-op in the full build: it hands nothing over (see lite_cli.go).
func keepArgs([]string) {}

// handOverOutput is a no-op in the full build: it prints every format itself.
func handOverOutput(string) error { return nil }

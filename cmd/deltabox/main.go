// Package main is deltabox, DeltaBox's command: `deltabox daemon` runs the node agent and every
// other verb is a thin client of its HTTP/JSON API (built twice, see lite.go). Each verb parses flags into options,
// calls one client function and prints the result as text or, with -o json, as JSON.
package main

import "os"

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

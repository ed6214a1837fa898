package main

import (
	"io"
	"testing"

	"github.com/urfave/cli/v2"
)

// hasName reads the flags' names without urfave/cli's Names(): it must agree with it for
// every flag of every command (a new flag type falls back to Names()).
func TestHasNameAgreesWithNames(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	var walk func(flags []cli.Flag, cmds []*cli.Command)
	n := 0
	walk = func(flags []cli.Flag, cmds []*cli.Command) {
		for _, f := range flags {
			for _, name := range f.Names() {
				n++
				if !hasName(f, name) {
					t.Errorf("hasName(%s, %q) is false", f.Names()[0], name)
				}
			}
			if hasName(f, f.Names()[0]+"x") {
				t.Errorf("hasName(%s, %q) is true", f.Names()[0], f.Names()[0]+"x")
			}
		}
		for _, c := range cmds {
			walk(c.Flags, c.Subcommands)
		}
	}
	walk(append(app.Flags, cli.HelpFlag, cli.VersionFlag), app.Commands)
	if n < 100 {
		t.Fatalf("checked %d flag names: the walk missed the commands", n)
	}
}

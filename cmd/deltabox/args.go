package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// reorderArgs moves a command's flags in front of its positional arguments, so that
// `deltabox pool create NAME --image X` works: urfave/cli v2 stops parsing flags at the first
// positional argument. Everything after "--" is left alone (exec's command line).
func reorderArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	rest := args[1:]
	flags, cmds := app.Flags, app.Commands
	for {
		lead, tail := splitLeadingFlags(rest, flags)
		out = append(out, lead...)
		if len(tail) == 0 {
			return out
		}
		cmd := findCommand(cmds, tail[0])
		if cmd == nil {
			return append(out, tail...)
		}
		out = append(out, tail[0])
		rest, flags, cmds = tail[1:], cmd.Flags, cmd.Subcommands
		if len(cmds) == 0 {
			return append(out, moveFlagsFirst(rest, flags)...)
		}
	}
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// splitLeadingFlags returns the flags (with their values) at the start of args, and the rest.
func splitLeadingFlags(args []string, flags []cli.Flag) ([]string, []string) {
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "--" && args[i] != "-" {
		i += flagWidth(args[i], flags)
	}
	i = min(i, len(args))
	return args[:i], args[i:]
}

// moveFlagsFirst reorders a leaf command's arguments: known flags first, then positionals.
func moveFlagsFirst(args []string, flags []cli.Flag) []string {
	var lead, pos []string
	for i := 0; i < len(args); {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i:]...)
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			n := min(flagWidth(a, flags), len(args)-i)
			lead = append(lead, args[i:i+n]...)
			i += n
			continue
		}
		pos = append(pos, a)
		i++
	}
	return append(lead, pos...)
}

// flagWidth is 2 for a value flag given as "--name value", else 1.
func flagWidth(arg string, flags []cli.Flag) int {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return 1
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if _, isBool := f.(*cli.BoolFlag); isBool {
				return 1
			}
			return 2
		}
	}
	return 1
}

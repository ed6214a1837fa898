package main

import (
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// passThrough names the verbs whose arguments after the first positional one are a command
// line of their own, passed on untouched (`deltabox exec ID ls -la`): their flags stop at the
// first positional argument, as docker's do. A "--" right after it is still accepted.
var passThrough = map[string]bool{"exec": true}

// reorderArgs rewrites a command line into the shape urfave/cli v2 parses, so that the CLI
// takes flags where docker and kubectl users put them:
//   - a command's flags after its positional arguments (`pool create NAME --image X`) move in
//     front of them: urfave/cli stops parsing flags at the first positional argument;
//   - global flags after the verb (`ls -o json`) move in front of the verb, unless the verb
//     has a flag of that name itself;
//   - `help VERB [SUB...]` becomes `VERB [SUB...] --help`, so that help reaches subcommands.
//
// Everything after "--", and a pass-through verb's command line, is left alone.
func reorderArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	globals, rest := splitLeadingFlags(args[1:], app.Flags)
	if len(rest) > 1 && (rest[0] == "help" || rest[0] == "h") {
		rest = append(append([]string{}, rest[1:]...), "--help")
	}
	var cmdPath []string
	cmds := app.Commands
	for len(rest) > 0 {
		cmd := findCommand(cmds, rest[0])
		if cmd == nil {
			break
		}
		cmdPath = append(cmdPath, rest[0])
		if cmd.SkipFlagParsing { // handed over whole (the cli build's `daemon`)
			cmdPath, rest = append(cmdPath, rest[1:]...), nil
			break
		}
		var lead []string
		lead, rest = splitLeadingFlags(rest[1:], append(append([]cli.Flag{}, cmd.Flags...), app.Flags...))
		g, own := hoistGlobals(lead, app.Flags, cmd.Flags)
		globals = append(globals, g...)
		cmdPath = append(cmdPath, own...)
		if len(cmd.Subcommands) > 0 {
			cmds = cmd.Subcommands
			continue
		}
		if passThrough[cmd.Name] {
			g, own := hoistGlobals(oldStyleExec(rest, cmd.Flags, app.Flags), app.Flags, cmd.Flags)
			globals = append(globals, g...)
			cmdPath = append(cmdPath, own...)
		} else {
			g, leaf := hoistGlobals(moveFlagsFirst(rest, append(append([]cli.Flag{}, cmd.Flags...), app.Flags...)), app.Flags, cmd.Flags)
			globals = append(globals, g...)
			cmdPath = append(cmdPath, leaf...)
		}
		rest = nil
	}
	out := append([]string{args[0]}, globals...)
	out = append(out, cmdPath...)
	return append(out, rest...)
}

// oldStyleExec accepts the older `exec ID [FLAGS] -- CMD` form: when everything between the
// ID and a "--" is the verb's (or global) flags, they move in front of the ID. Anything else
// is left alone: it is the command line.
func oldStyleExec(args []string, cmdFlags, globalFlags []cli.Flag) []string {
	dash := slices.Index(args, "--")
	if dash < 2 {
		return args
	}
	all := append(append([]cli.Flag{}, cmdFlags...), globalFlags...)
	mid := args[1:dash]
	for i := 0; i < len(mid); {
		if !isFlag(mid[i]) || lookupFlag(all, flagName(mid[i])) == nil {
			return args
		}
		i += flagWidth(mid[i], all)
	}
	out := append(append([]string{}, mid...), args[0])
	return append(out, args[dash:]...)
}

// hoistGlobals splits args (flags first, then positionals) into the global flags among the
// leading flags that cmdFlags does not define, and the rest in order.
func hoistGlobals(args []string, globalFlags, cmdFlags []cli.Flag) (globals, rest []string) {
	all := append(append([]cli.Flag{}, cmdFlags...), globalFlags...)
	i := 0
	for i < len(args) && isFlag(args[i]) {
		n := min(flagWidth(args[i], all), len(args)-i)
		name := flagName(args[i])
		if lookupFlag(globalFlags, name) != nil && lookupFlag(cmdFlags, name) == nil {
			globals = append(globals, args[i:i+n]...)
		} else {
			rest = append(rest, args[i:i+n]...)
		}
		i += n
	}
	return globals, append(rest, args[i:]...)
}

func isFlag(a string) bool { return strings.HasPrefix(a, "-") && a != "-" && a != "--" }

func flagName(arg string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return name
}

func lookupFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if hasName(f, name) {
			return f
		}
	}
	return nil
}

// hasName reports whether name is f's name or one of its aliases. It reads the flag types
// of this CLI directly: urfave/cli's Names() runs a regexp over every name (~5 KiB of
// garbage a call), and reorderArgs looks flags up for each argument of every call.
func hasName(f cli.Flag, name string) bool {
	var main string
	var aliases []string
	switch f := f.(type) {
	case *cli.StringFlag:
		main, aliases = f.Name, f.Aliases
	case *cli.BoolFlag:
		main, aliases = f.Name, f.Aliases
	case *cli.StringSliceFlag:
		main, aliases = f.Name, f.Aliases
	case *cli.IntFlag:
		main, aliases = f.Name, f.Aliases
	case *cli.Int64Flag:
		main, aliases = f.Name, f.Aliases
	case *cli.Uint64Flag:
		main, aliases = f.Name, f.Aliases
	case *cli.Float64Flag:
		main, aliases = f.Name, f.Aliases
	case *cli.DurationFlag:
		main, aliases = f.Name, f.Aliases
	default:
		return slices.Contains(f.Names(), name)
	}
	return main == name || slices.Contains(aliases, name)
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
	for i < len(args) && isFlag(args[i]) {
		i += flagWidth(args[i], flags)
	}
	i = min(i, len(args))
	return args[:i:i], args[i:] // capped: appending to the flags must not overwrite args
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
		if isFlag(a) {
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
	if strings.Contains(arg, "=") {
		return 1
	}
	f := lookupFlag(flags, flagName(arg))
	if f == nil {
		return 1
	}
	if _, isBool := f.(*cli.BoolFlag); isBool {
		return 1
	}
	return 2
}

// outputFromArgs finds -o/--output in a reordered command line's global flags (before the
// verb), for reporting errors in the asked format when parsing failed.
func outputFromArgs(app *cli.App, args []string) string {
	if len(args) < 2 {
		return ""
	}
	lead, _ := splitLeadingFlags(args[1:], app.Flags)
	out := ""
	for i := 0; i < len(lead); i++ {
		switch name := flagName(lead[i]); {
		case name != "o" && name != "output":
		case strings.Contains(lead[i], "="):
			_, out, _ = strings.Cut(lead[i], "=")
		case i+1 < len(lead):
			out = lead[i+1]
		}
	}
	return out
}

package main

import "strings"

// defaultAddress is the daemon's default API socket (client.DefaultAddress; a test keeps
// them equal).
const defaultAddress = "/run/deltabox/deltabox.sock"

// completionFlag is urfave/cli's shell-completion flag: deltabox-cli answers it.
const completionFlag = "--generate-bash-completion"

// call is a command line the fast front runs itself.
type call struct {
	verb      string   // "lease", "exec", "checkpoint" (create), "rollback", "release" or "version"
	address   string   // unix socket path
	json      bool     // -o json
	pool      string   // lease
	id        string   // exec, checkpoint create, rollback
	ids       []string // release
	argv      []string
	outputCap int64  // exec --output-cap
	body      []byte // checkpoint create and rollback: the request, as json.Marshal writes it
}

// parse reads a command line (without argv[0]) the way deltabox-cli would (reorderArgs,
// then urfave/cli), and reports false for any it does not know in full: those are handed
// over. getenv is syscall.Getenv (DELTABOX_ADDRESS, as urfave/cli reads it: set counts, even
// empty).
func parse(args []string, getenv func(string) (string, bool)) (call, bool) {
	c := call{address: defaultAddress}
	if a, ok := getenv("DELTABOX_ADDRESS"); ok {
		c.address = a
	}
	if len(args) == 1 && isVersionFlag(args[0]) {
		return call{verb: "version"}, true
	}
	if len(args) == 0 || args[len(args)-1] == completionFlag {
		return c, false
	}
	out := "text"
	i, ok := c.globals(args, 0, &out)
	if !ok || i >= len(args) {
		return c, false
	}
	c.verb = args[i]
	switch c.verb {
	case "lease":
		ok = c.parseLease(args[i+1:], &out)
	case "exec":
		ok = c.parseExec(args[i+1:], &out)
	case "checkpoint":
		ok = i+1 < len(args) && args[i+1] == "create" && c.parseCheckpoint(args[i+2:], &out)
	case "rollback":
		ok = c.parseRollback(args[i+1:], &out)
	case "release":
		ok = c.parseRelease(args[i+1:], &out)
	default:
		return c, false
	}
	c.json = out == "json"
	return c, ok && (out == "text" || out == "wide" || out == "json") && c.validAddress()
}

func isVersionFlag(a string) bool {
	name, ok := flagName(a)
	return ok && !strings.Contains(a, "=") && (name == "version" || name == "v")
}

// globals reads the global flags the front knows (--address/-a, --output/-o) from args[i:]
// up to the first argument that is not a flag; false for any other flag.
func (c *call) globals(args []string, i int, out *string) (int, bool) {
	for i < len(args) && isFlag(args[i]) {
		name, val, n, ok := flagValue(args, i)
		if !ok || !c.global(name, val, out) {
			return i, false
		}
		i += n
	}
	return i, true
}

// global sets a global flag; false when name is not one the front knows.
func (c *call) global(name, val string, out *string) bool {
	switch name {
	case "address", "a":
		c.address = val
	case "output", "o":
		*out = val
	default:
		return false
	}
	return true
}

// parseLease reads lease's arguments: --pool NAME and global flags, in any order, and no
// positional argument.
func (c *call) parseLease(args []string, out *string) bool {
	for i := 0; i < len(args); {
		if !isFlag(args[i]) {
			return false // a positional argument (or --): deltabox-cli's usage error
		}
		name, val, n, ok := flagValue(args, i)
		if !ok {
			return false
		}
		if name == "pool" {
			c.pool = val
		} else if !c.global(name, val, out) {
			return false
		}
		i += n
	}
	return safeName(c.pool)
}

// parseExec reads exec's arguments: global flags and --output-cap, the sandbox ID, then the
// command line (after an optional --), which must not start with a flag: deltabox-cli reads
// `exec ID [FLAGS] -- CMD` as the older form with flags (args.go, oldStyleExec).
func (c *call) parseExec(args []string, out *string) bool {
	i := 0
	for i < len(args) && isFlag(args[i]) {
		name, val, n, ok := flagValue(args, i)
		if !ok {
			return false
		}
		if name == "output-cap" {
			if c.outputCap, ok = decimal(val); !ok {
				return false
			}
		} else if !c.global(name, val, out) {
			return false
		}
		i += n
	}
	if i >= len(args) || !safeName(args[i]) {
		return false
	}
	c.id, c.argv = args[i], args[i+1:]
	if len(c.argv) > 0 && c.argv[0] == "--" {
		c.argv = c.argv[1:]
	} else if len(c.argv) > 0 && strings.HasPrefix(c.argv[0], "-") {
		return false
	}
	return len(c.argv) > 0
}

// leaf reads a command's arguments after its name, as deltabox-cli reads them after
// reorderArgs: flags (the command's own, which flag reads, and the globals) anywhere, the
// rest positional. A positional argument must be a safeName; "--" and an unknown flag are
// refused (handed over).
func (c *call) leaf(args []string, out *string, flag func(name, val string, hasVal bool) bool) ([]string, bool) {
	var pos []string
	for i := 0; i < len(args); {
		if !isFlag(args[i]) {
			if !safeName(args[i]) {
				return nil, false
			}
			pos = append(pos, args[i])
			i++
			continue
		}
		name, ok := flagName(args[i])
		if !ok {
			return nil, false
		}
		if !strings.Contains(args[i], "=") && flag(name, "", false) { // a bool flag, bare
			i++
			continue
		}
		name, val, n, ok := flagValue(args, i)
		if !ok || !(flag(name, val, true) || c.global(name, val, out)) {
			return nil, false
		}
		i += n
	}
	return pos, true
}

// parseCheckpoint reads `checkpoint create` 's arguments: ID and --level, -m/--message,
// --name, --pin, --async, --processes (bool flags bare only: --pin=false is handed over).
func (c *call) parseCheckpoint(args []string, out *string) bool {
	var level, msg, name, msgForm string
	var pin, async, procs bool
	pos, ok := c.leaf(args, out, func(f, val string, hasVal bool) bool {
		switch {
		case hasVal && f == "level":
			level = val
		case hasVal && (f == "message" || f == "m"):
			if msgForm != "" && msgForm != f { // urfave/cli: "Cannot use two forms of the same flag" (exit 2)
				return false
			}
			msg, msgForm = val, f
		case hasVal && f == "name":
			name = val
		case !hasVal && f == "pin":
			pin = true
		case !hasVal && f == "async":
			async = true
		case !hasVal && f == "processes":
			procs = true
		default:
			return false
		}
		return true
	})
	if !ok || len(pos) != 1 {
		return false
	}
	c.id = pos[0]
	b := []byte{'{'}
	for _, m := range []struct{ k, v string }{{"level", level}, {"message", msg}, {"name", name}} {
		if m.v != "" {
			b = appendJSONString(append(appendJSONString(sep(b), m.k), ':'), m.v)
		}
	}
	for _, m := range []struct {
		k  string
		on bool
	}{{"pin", pin}, {"processes", procs}, {"async", async}} {
		if m.on {
			b = append(appendJSONString(sep(b), m.k), ":true"...)
		}
	}
	c.body = append(b, '}')
	return true
}

// parseRollback reads rollback's arguments: ID and --to, --force, --replay (bare).
func (c *call) parseRollback(args []string, out *string) bool {
	var to string
	var force, replay bool
	pos, ok := c.leaf(args, out, func(f, val string, hasVal bool) bool {
		switch {
		case hasVal && f == "to":
			to = val
		case !hasVal && f == "force":
			force = true
		case !hasVal && f == "replay":
			replay = true
		default:
			return false
		}
		return true
	})
	if !ok || len(pos) != 1 {
		return false
	}
	c.id = pos[0]
	b := []byte{'{'}
	if to != "" {
		b = appendJSONString(append(b, `"to":`...), to)
	}
	if force {
		b = append(sep(b), `"force":true`...)
	}
	if replay {
		b = append(sep(b), `"replay":true`...)
	}
	c.body = append(b, '}')
	return true
}

// parseRelease reads release's arguments: one or more IDs (and global flags).
func (c *call) parseRelease(args []string, out *string) bool {
	pos, ok := c.leaf(args, out, func(string, string, bool) bool { return false })
	c.ids = pos
	return ok && len(pos) > 0
}

// sep appends the comma before a member unless b is the object's opening brace.
func sep(b []byte) []byte {
	if len(b) > 1 {
		return append(b, ',')
	}
	return b
}

// validAddress accepts the addresses the front dials: a unix socket path (unix:// or not)
// that fits a sockaddr_un and is not abstract. tcp:// (TLS, a token) goes to deltabox-cli.
func (c *call) validAddress() bool {
	if c.verb == "version" {
		return true
	}
	c.address = strings.TrimPrefix(c.address, "unix://")
	a := c.address
	return a != "" && len(a) < 108 && !strings.Contains(a, "://") && a[0] != '@' && !strings.ContainsRune(a, 0)
}

func isFlag(a string) bool { return strings.HasPrefix(a, "-") && a != "-" && a != "--" }

// flagName is a flag's name as Go's flag package reads it: one or two dashes, then a name
// that starts with neither a dash nor =.
func flagName(a string) (string, bool) {
	name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	if len(a) == len(name) || name == "" || name[0] == '-' || name[0] == '=' {
		return "", false
	}
	name, _, _ = strings.Cut(name, "=")
	return name, true
}

// flagValue reads the value flag at args[i]: "--name=value" (1 argument) or "--name value"
// (2). A value that looks like a flag or is empty is refused (deltabox-cli takes it as the
// value, or refuses it: left to it).
func flagValue(args []string, i int) (name, val string, n int, ok bool) {
	if name, ok = flagName(args[i]); !ok {
		return "", "", 0, false
	}
	if _, v, eq := strings.Cut(args[i], "="); eq {
		val, n = v, 1
	} else if i+1 < len(args) {
		val, n = args[i+1], 2
	}
	return name, val, n, n > 0 && val != "" && !strings.HasPrefix(val, "-")
}

// safeName accepts the pool names and sandbox IDs that go into a URL path as they are
// (url.PathEscape leaves them alone) and cannot be read as a flag.
func safeName(s string) bool {
	if s == "" || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_' || b == '.' || b == '~') {
			return false
		}
	}
	return s != "." && s != ".."
}

// decimal reads a plain non-negative decimal (urfave/cli reads 010 as octal: left to it).
func decimal(s string) (int64, bool) {
	if s == "" || len(s) > 18 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

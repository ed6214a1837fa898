package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func execCommand() *cli.Command {
	return &cli.Command{
		Name: "exec", Usage: "run a command in a sandbox; exits with the command's exit code",
		ArgsUsage: "ID CMD [ARGS...]",
		Description: "Flags go before ID; everything after ID is the command line, passed as is\n" +
			"(`deltabox exec ID python3 -c 'print(1)'`; a -- after ID is accepted too).",
		UseShortOptionHandling: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "timeout", Usage: "kill the command's process group after `SECONDS` (30, 0.5) or a duration (1m30s)"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "K=V (repeatable)"},
			&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory"},
			&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "uid[:gid] or name[:group]"},
			&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "pass standard input to the command"},
			&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "start the command and print its proc ID (deltabox logs ID PROC shows its output)"},
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "give the command a terminal in the sandbox (/dev/pts/N, the local window size); with -i the local terminal goes raw: Ctrl-C, Ctrl-D and every other key reach the command"},
			&cli.Int64Flag{Name: "output-cap", Usage: "bytes of output kept per stream (0: all)"},
			&cli.StringFlag{Name: "via", Usage: "init (fast) or containerd (runc exec); default: init, containerd if the init does not answer"},
		},
		Action: runExec,
	}
}

func runExec(c *cli.Context) error {
	if c.NArg() < 2 {
		return usagef("exec needs a sandbox ID and a command: deltabox exec [FLAGS] ID CMD [ARGS...]")
	}
	timeout, err := parseTimeout(c.String("timeout"))
	if err != nil {
		return err
	}
	args := c.Args().Slice()
	if args[1] == "--" {
		args = append(args[:1], args[2:]...)
	}
	if len(args) < 2 {
		return usagef("exec needs a command after the sandbox ID")
	}
	req := api.ExecRequest{Argv: args[1:], Env: c.StringSlice("env"), Workdir: c.String("workdir"),
		User: c.String("user"), TimeoutMS: float64(timeout) / float64(time.Millisecond), OutputCap: c.Int64("output-cap"), Via: c.String("via")}
	if c.Bool("tty") {
		if c.Bool("detach") {
			return usagef("exec -d cannot have a terminal (-t)")
		}
		return runExecTTY(c, args[0], req)
	}
	if c.Bool("detach") {
		if c.Bool("interactive") {
			return usagef("exec -d takes no stdin (-i)")
		}
		p, err := newClient(c).ExecDetached(c.Context, args[0], req)
		if err != nil {
			return err
		}
		return printResult(c, p, func(w io.Writer) { fmt.Fprintln(w, p.Proc) })
	}
	var stdin io.Reader
	if c.Bool("interactive") {
		stdin = os.Stdin
	}
	stdout, stderr := io.Writer(c.App.Writer), io.Writer(c.App.ErrWriter)
	var jw *jsonLines
	if jsonOutput(c) {
		jw = &jsonLines{enc: json.NewEncoder(c.App.Writer)}
		stdout, stderr = jw.stream("stdout"), jw.stream("stderr")
	}
	st, err := newClient(c).Exec(c.Context, args[0], req, stdin, stdout, stderr)
	if err != nil {
		return err
	}
	if jw != nil {
		jw.emit(map[string]any{"exit": st})
	} else if st.Error != "" {
		io.WriteString(c.App.ErrWriter, "deltabox: "+strings.TrimSpace(st.Error)+"\n")
	} else if st.TimedOut {
		io.WriteString(c.App.ErrWriter, "deltabox: command timed out after "+timeout.String()+" and was killed\n")
	}
	if jw == nil {
		reportTruncation(c.App.ErrWriter, st, req.OutputCap)
	}
	if st.Code != 0 {
		return exitCodeError{code: st.Code}
	}
	return nil
}

// parseTimeout reads --timeout: plain seconds ("30", "0.5") or a Go duration ("1m30s").
func parseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if secs, err := strconv.ParseFloat(s, 64); err == nil && secs >= 0 && secs < 1e9 {
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, usagef("--timeout %q: want seconds (30, 0.5) or a duration (90s, 1m30s)", s)
	}
	return d, nil
}

// reportTruncation says on stderr which streams --output-cap cut, so that a short output is
// not mistaken for the whole of it.
func reportTruncation(w io.Writer, st api.ExitStatus, limit int64) {
	var cut []string
	if st.StdoutTruncated {
		cut = append(cut, "stdout")
	}
	if st.StderrTruncated {
		cut = append(cut, "stderr")
	}
	if len(cut) > 0 {
		fmt.Fprintf(w, "deltabox: %s cut at %d bytes (--output-cap); the rest was dropped\n", strings.Join(cut, " and "), limit)
	}
}

// jsonLines prints exec output as JSON lines: {"stdout": "..."}, {"stderr": "..."}, and a
// final {"exit": {...}}.
type jsonLines struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (j *jsonLines) emit(v any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	_ = j.enc.Encode(v)
}

type jsonStream struct {
	j    *jsonLines
	name string
}

func (j *jsonLines) stream(name string) io.Writer { return jsonStream{j: j, name: name} }

func (s jsonStream) Write(p []byte) (int, error) {
	if len(p) > 0 {
		s.j.emit(map[string]string{s.name: string(p)})
	}
	return len(p), nil
}

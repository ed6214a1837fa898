package main

import (
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func execCommand() *cli.Command {
	return &cli.Command{
		Name: "exec", Usage: "run a command in a sandbox; exits with the command's exit code",
		ArgsUsage: "ID -- CMD [ARGS...]",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "timeout", Usage: "kill the command's process group after this long"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "K=V (repeatable)"},
			&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory"},
			&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "uid[:gid] or name[:group]"},
			&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "pass standard input to the command"},
			&cli.Int64Flag{Name: "output-cap", Usage: "bytes of output kept per stream (0: all)"},
			&cli.StringFlag{Name: "via", Usage: "init (fast) or containerd (runc exec); default: init, containerd if the init does not answer"},
		},
		Action: runExec,
	}
}

func runExec(c *cli.Context) error {
	if c.NArg() < 2 {
		return usagef("exec needs a sandbox ID and a command: deltabox exec ID -- CMD [ARGS...]")
	}
	args := c.Args().Slice()
	if args[1] == "--" {
		args = append(args[:1], args[2:]...)
	}
	if len(args) < 2 {
		return usagef("exec needs a command after --")
	}
	req := api.ExecRequest{Argv: args[1:], Env: c.StringSlice("env"), Workdir: c.String("workdir"),
		User: c.String("user"), Timeout: c.Duration("timeout"), OutputCap: c.Int64("output-cap"), Via: c.String("via")}
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
		io.WriteString(c.App.ErrWriter, "deltabox: command timed out after "+req.Timeout.String()+" and was killed\n")
	}
	if st.Code != 0 {
		return exitCodeError{code: st.Code}
	}
	return nil
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

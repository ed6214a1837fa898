//go:build !cli

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pipeline"
)

// runOptions are the flags of `deltabox run`.
type runOptions struct {
	pipeline string
	tasks    string
	results  string
	logDir   string
	parallel int
	logLevel string
	engine   string // "local" or temporal://HOST:PORT[/NAMESPACE][?task_queue=Q]
	runKey   string
	nodeTTL  time.Duration
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     runUsage,
		ArgsUsage: "PIPELINE.yaml",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "tasks", Usage: "JSON-lines file, one task per line (default: one empty task)"},
			&cli.IntFlag{Name: "parallel", Aliases: []string{"p"}, Value: 1, Usage: "tasks run at once (temporal: task workflows in flight, default 256)"},
			&cli.StringFlag{Name: "results", Usage: "append one JSON line per task here; tasks already finished in it are skipped (resume)"},
			&cli.StringFlag{Name: "log-dir", Usage: "write each attempt's output to DIR/task-INDEX/STEP.ATTEMPT.log"},
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "debug, info, warn or error (logs go to stderr)"},
			&cli.StringFlag{Name: "engine", Value: "local", Usage: "local (this daemon), or temporal://HOST:PORT[/NAMESPACE][?task_queue=Q&tls=1]: one workflow per task on the nodes of a Temporal task queue (docs/scale-out.md)"},
			&cli.StringFlag{Name: "run-key", Usage: "temporal: tells apart runs of the same pipeline and tasks (the same key picks up the same workflows)"},
			&cli.DurationFlag{Name: "node-timeout", Value: 10 * time.Second, Usage: "temporal: a node silent this long loses its tasks to other nodes"},
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "PIPELINE.yaml"); err != nil {
				return err
			}
			o := runOptions{pipeline: c.Args().First(), tasks: c.String("tasks"), results: c.String("results"),
				logDir: c.String("log-dir"), parallel: c.Int("parallel"), logLevel: c.String("log-level"),
				engine: c.String("engine"), runKey: c.String("run-key"), nodeTTL: c.Duration("node-timeout")}
			if o.engine != "local" && !c.IsSet("parallel") {
				o.parallel = 256 // on Temporal the nodes' capacity bounds what runs: queue every task
			}
			if o.parallel < 1 {
				return usagef("--parallel %d: want at least 1", o.parallel)
			}
			return runPipeline(c, o)
		},
	}
}

func runPipeline(c *cli.Context, o runOptions) error {
	ctx, err := runLogger(c.Context, c.App.ErrWriter, o.logLevel)
	if err != nil {
		return err
	}
	eng, err := parseEngine(o)
	if err != nil {
		return err
	}
	p, tasks, done, err := loadRun(o)
	if err != nil {
		return err
	}
	out := newResultSink(c.App.Writer, jsonOutput(c))
	if o.results != "" {
		if err := out.openFile(o.results); err != nil {
			return err
		}
		defer out.close()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	var sum pipeline.Summary
	if eng != nil {
		sum, err = runOnTemporal(ctx, eng, p, tasks, done, out.write, o)
	} else {
		sum, err = pipeline.Run(ctx, newClient(c), p, tasks, pipeline.Options{
			Parallel: o.parallel, Done: done, OnResult: out.write, Output: attemptLogs(o.logDir)})
	}
	if err != nil {
		return err
	}
	if err := out.summary(sum); err != nil {
		return err
	}
	return runOutcome(sum, o)
}

// loadRun reads the pipeline, the tasks and the results of an earlier run; nothing is leased
// before all three are valid.
func loadRun(o runOptions) (*pipeline.Pipeline, []pipeline.Task, map[int]pipeline.Result, error) {
	p, err := pipeline.Load(o.pipeline)
	if err != nil {
		return nil, nil, nil, err
	}
	tasks := []pipeline.Task{pipeline.EmptyTask()}
	if o.tasks != "" {
		if tasks, err = pipeline.ReadTasksFile(o.tasks); err != nil {
			return nil, nil, nil, err
		}
	}
	done := map[int]pipeline.Result{}
	if o.results != "" {
		if done, err = pipeline.ReadFinished(o.results); err != nil {
			return nil, nil, nil, err
		}
	}
	return p, tasks, done, nil
}

// runOutcome turns an interrupted run or failed tasks into an error (exit code 1).
func runOutcome(sum pipeline.Summary, o runOptions) error {
	if sum.Interrupted > 0 {
		hint := "run again with --results to resume"
		if o.results != "" {
			hint = "run the same command again to resume"
		}
		return fmt.Errorf("interrupted: %d of %d tasks did not finish; %s", sum.Interrupted, sum.Tasks, hint)
	}
	if sum.Failed > 0 {
		return fmt.Errorf("%d of %d tasks failed", sum.Failed, sum.Tasks-sum.Skipped)
	}
	return nil
}

// runLogger puts a stderr logger at level into ctx.
func runLogger(ctx context.Context, w io.Writer, level string) (context.Context, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	return log.WithLogger(ctx, slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))), nil
}

// attemptLogs returns an Output function writing under dir, or nil.
func attemptLogs(dir string) func(pipeline.Task, string, int) io.Writer {
	if dir == "" {
		return nil
	}
	return func(t pipeline.Task, step string, attempt int) io.Writer {
		d := filepath.Join(dir, fmt.Sprintf("task-%d", t.Index))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return io.Discard
		}
		f, err := os.Create(filepath.Join(d, fmt.Sprintf("%s.%d.log", step, attempt)))
		if err != nil {
			return io.Discard
		}
		return f
	}
}

// resultSink writes task results: JSON lines on stdout with -o json (a table at the end
// otherwise), and appended to the results file when there is one.
type resultSink struct {
	w      io.Writer
	json   bool
	file   *os.File
	rows   []pipeline.Result
	prefix string
}

func newResultSink(w io.Writer, json bool) *resultSink { return &resultSink{w: w, json: json} }

// openFile opens the results file for appending; a line torn by an interrupted run is ended
// so the next line starts clean.
func (s *resultSink) openFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open results: %w", err)
	}
	s.file = f
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			s.prefix = "\n"
		}
	}
	return nil
}

func (s *resultSink) close() {
	if s.file != nil {
		_ = s.file.Close()
	}
}

// write records one task's result.
func (s *resultSink) write(r pipeline.Result) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if s.file != nil {
		if _, err := s.file.WriteString(s.prefix + string(line)); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
		s.prefix = ""
		if err := s.file.Sync(); err != nil {
			return fmt.Errorf("sync results: %w", err)
		}
	}
	if s.json {
		_, err = s.w.Write(line)
		return err
	}
	s.rows = append(s.rows, r)
	return nil
}

// summary prints the final line (JSON) or the table and totals (text).
func (s *resultSink) summary(sum pipeline.Summary) error {
	if s.json {
		return json.NewEncoder(s.w).Encode(map[string]any{"summary": sum})
	}
	printResultTable(s.w, s.rows)
	printSummary(s.w, sum)
	return nil
}

func printResultTable(w io.Writer, rows []pipeline.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "TASK\tID\tSTATUS\tATTEMPTS\tROLLBACKS\tCHECKPOINTS\tEFFECTS(H/C/D)\tDURATION\tSTEPS\tERROR")
	for _, r := range rows {
		steps := make([]string, 0, len(r.Steps))
		for _, st := range r.Steps {
			steps = append(steps, fmt.Sprintf("%s:%s/%d", st.Name, st.Status, st.Attempts))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d/%d/%d\t%s\t%s\t%s\n", r.Index, r.ID, r.Status, r.Attempts,
			r.Rollbacks, r.Checkpoints, r.Effects.Held, r.Effects.Committed, r.Effects.Dropped,
			time.Duration(r.DurationMS*float64(time.Millisecond)).Round(time.Millisecond),
			strings.Join(steps, " "), oneLine(r.Error))
	}
}

func printSummary(w io.Writer, s pipeline.Summary) {
	fmt.Fprintf(w, "\npipeline %s: %d tasks, %d succeeded, %d failed, %d interrupted, %d skipped (already done)\n",
		s.Pipeline, s.Tasks, s.Succeeded, s.Failed, s.Interrupted, s.Skipped)
	fmt.Fprintf(w, "steps %d, attempts %d, failures %d, rollbacks %d, checkpoints %d, commits %d\n",
		s.Steps, s.Attempts, s.Failures, s.Rollbacks, s.Checkpoints, s.Commits)
	fmt.Fprintf(w, "effects held %d, committed %d, dropped %d\n", s.Effects.Held, s.Effects.Committed, s.Effects.Dropped)
	fmt.Fprintf(w, "checkpoint p50 %.2f ms p99 %.2f ms (n=%d); rollback p50 %.2f ms p99 %.2f ms (n=%d); total %.0f ms\n",
		s.CheckpointMS.P50, s.CheckpointMS.P99, s.CheckpointMS.N, s.RollbackMS.P50, s.RollbackMS.P99, s.RollbackMS.N, s.DurationMS)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

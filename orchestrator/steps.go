package orchestrator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// The step record (docs/time-travel.md): every exec in a leased sandbox is appended to the
// session's steps.jsonl with the checkpoint it ran after (the head when it started), its
// argv, workdir, start, duration, exit and the first and last bytes of its output. Records
// are not synced (a crash may lose the last ones, never corrupt the others: a torn last line
// is skipped); at most Options.StepMax are kept (the oldest quarter is dropped when the
// bound is reached). A pool or lease label deltabox.steps=off turns recording off.

const (
	stepsFile     = "steps.jsonl"
	stepsOffLabel = "deltabox.steps"
)

// stepLog is a session's step record.
type stepLog struct {
	mu   sync.Mutex
	path string
	next int // seq of the next record (0: not read yet)
	n    int // records in the file
}

// recordSteps reports whether execs in sandbox s are recorded.
func (o *Orchestrator) recordSteps(s *session) bool {
	return o.opts.StepMax >= 0 && s.sb.Labels[stepsOffLabel] != "off"
}

// captureBuf keeps the first and last limit bytes written to it and counts the rest.
type captureBuf struct {
	limit int
	head  []byte
	tail  []byte // ring of the last bytes, kept in order (small: copied on write)
	total int64
}

func (c *captureBuf) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	rest := p
	if room := c.limit - len(c.head); room > 0 {
		n := min(room, len(rest))
		c.head = append(c.head, rest[:n]...)
		rest = rest[n:]
	}
	if len(rest) > 0 {
		c.tail = append(c.tail, rest...)
		if over := len(c.tail) - c.limit; over > 0 {
			c.tail = append(c.tail[:0:0], c.tail[over:]...)
		}
	}
	return len(p), nil
}

// teeWriter writes to w and to the capture; the capture never fails the stream.
type teeWriter struct {
	mu sync.Mutex
	w  interface{ Write([]byte) (int, error) }
	c  *captureBuf
}

func (t *teeWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	_, _ = t.c.Write(p)
	t.mu.Unlock()
	return t.w.Write(p)
}

// stepCapture is one exec being recorded.
type stepCapture struct {
	step           api.Step
	stdout, stderr *captureBuf
}

// beginStep starts recording an exec in s (nil when recording is off).
func (o *Orchestrator) beginStep(s *session, req api.ExecRequest) *stepCapture {
	if !o.recordSteps(s) {
		return nil
	}
	s.mu.RLock()
	head := s.head
	s.mu.RUnlock()
	limit := o.opts.StepOutputBytes
	return &stepCapture{step: api.Step{Checkpoint: head, Argv: req.Argv, Workdir: req.Workdir, Started: time.Now().UTC()},
		stdout: &captureBuf{limit: limit}, stderr: &captureBuf{limit: limit}}
}

// endStep finishes and appends the record (a failure to write it is logged).
func (o *Orchestrator) endStep(ctx context.Context, s *session, c *stepCapture, exit *api.ExitStatus, err error) {
	if c == nil {
		return
	}
	st := &c.step
	st.DurationMS = ms(time.Since(st.Started))
	st.Exit = exit
	if err != nil {
		st.Error = err.Error()
	}
	st.StdoutHead, st.StdoutTail, st.StdoutBytes = string(c.stdout.head), string(c.stdout.tail), c.stdout.total
	st.StderrHead, st.StderrTail, st.StderrBytes = string(c.stderr.head), string(c.stderr.tail), c.stderr.total
	if werr := s.steps.append(st, o.opts.StepMax); werr != nil {
		log.L(ctx).Warn("record step", "sandbox", s.id, "error", werr)
	}
}

// append writes one record, numbering it, and bounds the file to max records.
func (l *stepLog) append(st *api.Step, max int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next == 0 {
		all, err := l.readLocked()
		if err != nil {
			return err
		}
		l.next, l.n = 1, len(all)
		if len(all) > 0 {
			l.next = all[len(all)-1].Seq + 1
		}
	}
	st.Seq = l.next
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(data, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	l.next++
	l.n++
	if max > 0 && l.n > max {
		return l.trimLocked(max - max/4)
	}
	return nil
}

// trimLocked keeps the newest keep records (a new file renamed over the old one).
func (l *stepLog) trimLocked(keep int) error {
	all, err := l.readLocked()
	if err != nil {
		return err
	}
	if len(all) > keep {
		all = all[len(all)-keep:]
	}
	var buf bytes.Buffer
	for _, st := range all {
		data, _ := json.Marshal(st)
		buf.Write(append(data, '\n'))
	}
	if err := atomicfile.WriteFile(l.path, buf.Bytes(), 0o600); err != nil {
		return err
	}
	l.n = len(all)
	return nil
}

// read returns every record, oldest first.
func (l *stepLog) read() ([]api.Step, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.readLocked()
}

func (l *stepLog) readLocked() ([]api.Step, error) {
	f, err := os.Open(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []api.Step
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var st api.Step
		if json.Unmarshal(sc.Bytes(), &st) == nil { // a torn last line is skipped
			out = append(out, st)
		}
	}
	return out, sc.Err()
}

func newStepLog(dir string) *stepLog { return &stepLog{path: filepath.Join(dir, stepsFile)} }

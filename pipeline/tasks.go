package pipeline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Task is one line of the tasks file.
type Task struct {
	Index  int            // position among the tasks (blank lines do not count), from 0
	Line   int            // line in the tasks file, from 1 (0: no tasks file)
	ID     string         // the task's "id" field, or its index
	Raw    string         // the JSON line as given (DELTABOX_TASK)
	Fields map[string]any // the decoded object (numbers as json.Number)
	Err    error          // the line is not a JSON object: the task fails without a lease
}

// EmptyTask is the single task of a run without a tasks file.
func EmptyTask() Task { return Task{ID: "0", Raw: "{}", Fields: map[string]any{}} }

// ReadTasksFile reads a JSON-lines tasks file.
func ReadTasksFile(path string) ([]Task, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open tasks: %w", err)
	}
	defer f.Close()
	return ReadTasks(f, path)
}

// ReadTasks reads one JSON object per line. A line that is not a JSON object becomes a task
// whose Err names the line; blank lines are skipped. Only a read error fails the whole call.
func ReadTasks(r io.Reader, source string) ([]Task, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var tasks []Task
	for line := 1; ; line++ {
		text, err := br.ReadString('\n')
		if t := strings.TrimSpace(text); t != "" {
			tasks = append(tasks, parseTask(source, len(tasks), line, t))
		}
		if err == io.EOF {
			return tasks, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read tasks from %s: %w", source, err)
		}
	}
}

func parseTask(source string, index, line int, text string) Task {
	t := Task{Index: index, Line: line, ID: strconv.Itoa(index), Raw: text}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	if err := dec.Decode(&t.Fields); err != nil || t.Fields == nil || dec.More() {
		if err == nil {
			err = fmt.Errorf("want one JSON object")
		}
		t.Err = fmt.Errorf("%s:%d: task is not a JSON object: %v: %w", source, line, err, errdefs.ErrInvalidArgument)
		t.Fields = map[string]any{}
		return t
	}
	var compact bytes.Buffer
	if json.Compact(&compact, []byte(text)) == nil {
		t.Raw = compact.String()
	}
	switch id := t.Fields["id"].(type) {
	case string:
		t.ID = id
	case json.Number:
		t.ID = id.String()
	}
	return t
}

// EnvName turns a task field name into its variable: TASK_<FIELD> upper-cased, with anything
// but letters, digits and '_' replaced by '_'.
func EnvName(field string) string {
	b := []byte("TASK_" + strings.ToUpper(field))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Env is the task's environment: TASK_<FIELD>=value for every scalar field (strings,
// numbers, booleans), sorted, and DELTABOX_TASK=<the JSON line>.
func (t Task) Env() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(t.Fields)) {
		switch v := t.Fields[k].(type) {
		case string:
			out = append(out, EnvName(k)+"="+v)
		case json.Number:
			out = append(out, EnvName(k)+"="+v.String())
		case bool:
			out = append(out, EnvName(k)+"="+strconv.FormatBool(v))
		}
	}
	return append(out, "DELTABOX_TASK="+t.Raw)
}

// TaskSeed derives a task's seed from the pipeline's seed and the task's index
// (splitmix64), in 1..2^32-1 so that it is also a valid PYTHONHASHSEED.
func TaskSeed(seed int64, index int) uint32 {
	return mix(uint64(seed), uint64(index))
}

// attemptSeed is the seed of one attempt of a fresh_random step.
func attemptSeed(taskSeed uint32, step, attempt int) uint32 {
	return mix(uint64(taskSeed)<<20^uint64(step), uint64(attempt))
}

func mix(a, b uint64) uint32 {
	z := a*0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	if s := uint32(z); s != 0 {
		return s
	}
	return 1
}

// randomEnv is what makes a run reproducible: the seed (also as PYTHONHASHSEED) and a start
// time. The clock is not virtualised; agents read DELTABOX_TASK_START for "now".
func randomEnv(seed uint32, start time.Time) []string {
	s := strconv.FormatUint(uint64(seed), 10)
	return []string{"DELTABOX_SEED=" + s, "PYTHONHASHSEED=" + s,
		"DELTABOX_TASK_START=" + start.UTC().Format(time.RFC3339Nano)}
}

package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"gopkg.in/yaml.v3"
)

// Commit policies: when a task's held effects are released.
const (
	CommitTask = "task" // once, at the end of a task that succeeded (the default)
	CommitStep = "step" // after every step that succeeded
)

// Checkpoint levels a step may ask for.
const (
	LevelL1 = "l1"
	LevelL2 = "l2"
)

// Pipeline is a parsed, validated pipeline file.
type Pipeline struct {
	Name      string            `yaml:"name"`
	Pool      string            `yaml:"pool"`
	Seed      *int64            `yaml:"seed"`    // default 1
	Commit    string            `yaml:"commit"`  // default commit policy of the steps
	Env       map[string]string `yaml:"env"`     // for every step (templated)
	Workdir   string            `yaml:"workdir"` // default working directory of the steps
	Timeout   time.Duration     `yaml:"timeout"` // default step timeout (0: none)
	Files     []File            `yaml:"files"`   // copied into every sandbox after the lease
	Steps     []*Step           `yaml:"steps"`
	Fallbacks []*Step           `yaml:"fallbacks"` // steps that run only when a step names them
	// Failover asks for L3 failover points (used by the Temporal engine, ignored by a local
	// run): "l3 every N steps" (or "l3 every step"); steps may also ask one for themselves.
	Failover string `yaml:"failover"`

	// Source names the file the pipeline came from, for messages.
	Source string `yaml:"-"`

	failoverEvery int    // from Failover: every N steps (0: none)
	raw           []byte // the file as parsed (Bundle)
	readFile      func(src string) ([]byte, error)
}

// Step is one unit of work of a task: checkpoint, exec, state patch, commit.
type Step struct {
	Name        string            `yaml:"name"`
	Run         []string          `yaml:"run"`    // argv (templated)
	Script      string            `yaml:"script"` // run with sh -c (templated)
	Env         map[string]string `yaml:"env"`
	Workdir     string            `yaml:"workdir"`
	Timeout     time.Duration     `yaml:"timeout"`
	State       yaml.Node         `yaml:"state"`      // JSON patch ops, applied after success
	Checkpoint  string            `yaml:"checkpoint"` // l1 (default) or l2
	Retry       Retry             `yaml:"retry"`
	OnFailure   FailurePolicy     `yaml:"on_failure"`
	Commit      string            `yaml:"commit"` // step or task (default: the pipeline's)
	FreshRandom bool              `yaml:"fresh_random"`
	Failover    string            `yaml:"failover"` // l3: an L3 failover point after this step (or none)

	// Line is where the step starts in the pipeline file.
	Line  int       `yaml:"-"`
	tmpl  *stepTmpl `yaml:"-"` // compiled templates
	fb    *Step     `yaml:"-"` // the fallback step, when OnFailure names one
	index int       `yaml:"-"` // position in the pipeline's steps (or fallbacks)
	pipe  *Pipeline `yaml:"-"`
}

// Retry says how often a step runs before its failure policy applies.
type Retry struct {
	Attempts int           `yaml:"attempts"` // total runs, including the first (default 1)
	Backoff  time.Duration `yaml:"backoff"`  // wait before the second run; doubles after each retry
}

// Failure policies.
const (
	OnFailureStop             = "stop"              // the task fails (the default)
	OnFailureRollbackContinue = "rollback_continue" // undo the step and go on with the next
	OnFailureFallback         = "fallback"          // undo the step and run another one instead
)

// FailurePolicy is what happens when a step failed all its attempts: `stop`,
// `rollback_continue` or `{fallback: NAME}`.
type FailurePolicy struct {
	Action   string
	Fallback string
	line     int
}

// UnmarshalYAML accepts a scalar policy or a {fallback: NAME} mapping.
func (f *FailurePolicy) UnmarshalYAML(n *yaml.Node) error {
	f.line = n.Line
	switch {
	case n.Kind == yaml.ScalarNode && (n.Value == OnFailureStop || n.Value == OnFailureRollbackContinue):
		f.Action = n.Value
		return nil
	case n.Kind == yaml.MappingNode && len(n.Content) == 2 && n.Content[0].Value == OnFailureFallback &&
		n.Content[1].Kind == yaml.ScalarNode && n.Content[1].Value != "":
		f.Action, f.Fallback = OnFailureFallback, n.Content[1].Value
		return nil
	}
	return lineErrorf(n.Line, "on_failure: want stop, rollback_continue or {fallback: STEP}")
}

// lineError is a problem at a line of the pipeline file; Parse prefixes the file name.
type lineError struct {
	line int
	msg  string
}

func (e *lineError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

func lineErrorf(line int, format string, args ...any) error {
	return &lineError{line: line, msg: fmt.Sprintf(format, args...)}
}

// Load reads and parses a pipeline file.
func Load(path string) (*Pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read pipeline: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes a pipeline file strictly (unknown fields are errors) and validates it. Every
// error names the file and line ("agent.yaml:12: ...") and is of class InvalidArgument.
func Parse(source string, data []byte) (*Pipeline, error) {
	return parse(source, data, nil)
}

// parse is Parse with the pipeline's files read by readFile (nil: from the disk).
func parse(source string, data []byte, readFile func(src string) ([]byte, error)) (*Pipeline, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fileError(source, err)
	}
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: a pipeline is a YAML mapping with pool and steps: %w", source, errdefs.ErrInvalidArgument)
	}
	p := &Pipeline{Source: source, raw: data, readFile: readFile}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(p); err != nil {
		return nil, fileError(source, err)
	}
	setLines(root.Content[0], "steps", p.Steps)
	setLines(root.Content[0], "fallbacks", p.Fallbacks)
	if err := p.validate(root.Content[0]); err != nil {
		return nil, fileError(source, err)
	}
	return p, nil
}

// setLines records where each step of the top-level sequence key starts.
func setLines(doc *yaml.Node, key string, steps []*Step) {
	seq := mapValue(doc, key)
	if seq == nil || seq.Kind != yaml.SequenceNode {
		return
	}
	for i, n := range seq.Content {
		if i < len(steps) && steps[i] != nil {
			steps[i].Line = n.Line
		}
	}
}

// mapValue returns the value of key in a mapping node, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// The patterns of this package are compiled on first use, not at start-up: the CLI links
// the package and runs its initialisers at every call (issue 19).
var (
	unknownFieldRE = lazyRE(`^line (\d+): field (\S+) not found in type pipeline\.(\w+)$`)
	lineRE         = lazyRE(`^(?:yaml: )?line (\d+): (.*)$`)
)

// lazyRE returns a function that compiles expr on its first call and returns the same
// regexp from then on.
func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// fileError rewrites decoder and validation errors as "SOURCE:LINE: message".
func fileError(source string, err error) error {
	var le *lineError
	if errors.As(err, &le) {
		return fmt.Errorf("%s:%d: %s: %w", source, le.line, le.msg, errdefs.ErrInvalidArgument)
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("%s: %s: %w", source, strings.TrimPrefix(err.Error(), "yaml: "), errdefs.ErrInvalidArgument)
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		msgs = append(msgs, rewriteTypeError(source, e))
	}
	return fmt.Errorf("%s: %w", strings.Join(msgs, "; "), errdefs.ErrInvalidArgument)
}

func rewriteTypeError(source, e string) string {
	if m := unknownFieldRE().FindStringSubmatch(e); m != nil {
		where, known := "the pipeline", knownFields(reflect.TypeFor[Pipeline]())
		switch m[3] {
		case "Step":
			where, known = "a step", knownFields(reflect.TypeFor[Step]())
		case "Retry":
			where, known = "retry", knownFields(reflect.TypeFor[Retry]())
		}
		return fmt.Sprintf("%s:%s: unknown field %q in %s (known: %s)", source, m[1], m[2], where, known)
	}
	if m := lineRE().FindStringSubmatch(e); m != nil {
		return fmt.Sprintf("%s:%s: %s", source, m[1], m[2])
	}
	return source + ": " + e
}

// knownFields lists the YAML names of a struct's fields.
func knownFields(t reflect.Type) string {
	var names []string
	for f := range t.Fields() {
		if tag := f.Tag.Get("yaml"); tag != "" && tag != "-" {
			names = append(names, tag)
		}
	}
	return strings.Join(names, ", ")
}

// DisplayName is the pipeline's name, or its file's base name.
func (p *Pipeline) DisplayName() string {
	if p.Name != "" {
		return p.Name
	}
	return strings.TrimSuffix(filepath.Base(p.Source), filepath.Ext(p.Source))
}

// SeedValue is the pipeline's seed (default 1).
func (p *Pipeline) SeedValue() int64 {
	if p.Seed == nil {
		return 1
	}
	return *p.Seed
}

package pipeline

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/template"

	"gopkg.in/yaml.v3"
)

// TemplateData is what run, script, env and state templates see: {{.Task.field}},
// {{.Index}}, {{.ID}}, {{.Seed}}, {{.Pipeline}}, {{.Step}}, {{.Attempt}}.
type TemplateData struct {
	Task     map[string]any
	Index    int
	ID       string
	Seed     uint32
	Pipeline string
	Step     string
	Attempt  int
}

// templateFuncs: json renders a value as JSON, sh quotes a string for a shell script.
var templateFuncs = template.FuncMap{
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"sh": func(v any) string { return "'" + strings.ReplaceAll(fmt.Sprint(v), "'", `'\''`) + "'" },
}

// stepTmpl holds a step's compiled templates.
type stepTmpl struct {
	run      []*template.Template
	script   *template.Template
	env      map[string]*template.Template
	stateOps any                // state given as YAML ops: string leaves are templates
	stateTxt *template.Template // state given as a string: a template of a JSON array
}

func newTemplate(name, text string) (*template.Template, error) {
	return template.New(name).Option("missingkey=error").Funcs(templateFuncs).Parse(text)
}

func render(t *template.Template, data TemplateData) (string, error) {
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}

// compileTemplates parses the step's run, script, env and state templates.
func (s *Step) compileTemplates(pipelineEnv map[string]string) error {
	t := &stepTmpl{env: map[string]*template.Template{}}
	for i, a := range s.Run {
		rt, err := newTemplate(fmt.Sprintf("run[%d]", i), a)
		if err != nil {
			return err
		}
		t.run = append(t.run, rt)
	}
	var err error
	if t.script, err = newTemplate("script", s.Script); err != nil {
		return err
	}
	env := maps.Clone(pipelineEnv)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, s.Env)
	for k, v := range env {
		if t.env[k], err = newTemplate("env "+k, v); err != nil {
			return err
		}
	}
	if err := t.compileState(&s.State); err != nil {
		return err
	}
	s.tmpl = t
	return nil
}

// compileState accepts a sequence of ops (string leaves templated) or a string (a template
// that must render to a JSON array).
func (t *stepTmpl) compileState(n *yaml.Node) error {
	switch n.Kind {
	case 0:
		return nil
	case yaml.ScalarNode:
		var err error
		t.stateTxt, err = newTemplate("state", n.Value)
		return err
	case yaml.SequenceNode:
		var ops []any
		if err := n.Decode(&ops); err != nil {
			return err
		}
		for i, op := range ops {
			m, ok := op.(map[string]any)
			if !ok || m["op"] == nil || m["path"] == nil {
				return fmt.Errorf("state op %d: want a mapping with op and path", i+1)
			}
		}
		t.stateOps = ops
		return checkLeaves(ops)
	}
	return fmt.Errorf("state: want a list of JSON patch ops or a string holding one")
}

// checkLeaves parses every string leaf of v as a template.
func checkLeaves(v any) error {
	_, err := renderLeaves(v, nil)
	return err
}

// renderLeaves copies v with every string leaf rendered (data nil: only parse).
func renderLeaves(v any, data *TemplateData) (any, error) {
	switch x := v.(type) {
	case string:
		t, err := newTemplate("state", x)
		if err != nil || data == nil {
			return x, err
		}
		return render(t, *data)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			var err error
			if out[i], err = renderLeaves(e, data); err != nil {
				return nil, err
			}
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			var err error
			if out[k], err = renderLeaves(e, data); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

// argv renders the step's command line.
func (s *Step) argv(data TemplateData) ([]string, error) {
	if s.Script != "" {
		script, err := render(s.tmpl.script, data)
		return []string{"sh", "-c", script}, err
	}
	out := make([]string, len(s.tmpl.run))
	for i, t := range s.tmpl.run {
		var err error
		if out[i], err = render(t, data); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// env renders the step's environment (the pipeline's env overlaid with the step's), sorted.
func (s *Step) env(data TemplateData) ([]string, error) {
	keys := slices.Sorted(maps.Keys(s.tmpl.env))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		v, err := render(s.tmpl.env[k], data)
		if err != nil {
			return nil, err
		}
		out = append(out, k+"="+v)
	}
	return out, nil
}

// statePatch renders the step's state patch as a JSON array, or nil when it has none.
func (s *Step) statePatch(data TemplateData) ([]byte, error) {
	switch {
	case s.tmpl.stateTxt != nil:
		txt, err := render(s.tmpl.stateTxt, data)
		if err != nil {
			return nil, err
		}
		var ops []json.RawMessage
		if err := json.Unmarshal([]byte(txt), &ops); err != nil {
			return nil, fmt.Errorf("state renders to %q, not a JSON array of ops: %w", txt, err)
		}
		return []byte(txt), nil
	case s.tmpl.stateOps != nil:
		ops, err := renderLeaves(s.tmpl.stateOps, &data)
		if err != nil {
			return nil, err
		}
		return json.Marshal(ops)
	}
	return nil, nil
}

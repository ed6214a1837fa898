package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"text/template"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Output formats of -o (--output).
const (
	outText = "text"
	outWide = "wide" // text with more columns (ls, pool ls, checkpoint ls)
	outJSON = "json"
	outYAML = "yaml"
)

func outputFormat(c *cli.Context) string { return c.String("output") }

// jsonOutput reports whether a machine format (-o json or yaml) was asked for: streams
// (exec output, progress events) are JSON lines in both.
func jsonOutput(c *cli.Context) bool {
	f := outputFormat(c)
	return f == outJSON || f == outYAML
}

// wideOutput reports whether -o wide was asked for.
func wideOutput(c *cli.Context) bool { return outputFormat(c) == outWide }

// printResult prints v as JSON (-o json), YAML (-o yaml), through the --format template, or
// through text otherwise (text and wide; the text printer asks wideOutput).
func printResult(c *cli.Context, v any, text func(w io.Writer)) error {
	w := c.App.Writer
	if tmpl := c.String("format"); tmpl != "" {
		return printTemplate(w, tmpl, v)
	}
	switch outputFormat(c) {
	case outJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case outYAML:
		return printYAML(w, v)
	}
	text(w)
	return nil
}

// asJSONValue is v as the generic value its JSON form decodes to, so that YAML output and
// templates see the API's field names (`sandbox`, `created`), not Go's.
func asJSONValue(v any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out any
	return out, dec.Decode(&out)
}

// printTemplate executes the Go template tmpl on v's JSON form: once per element when v is
// a list (as docker and kubectl do), else once; a newline follows each.
func printTemplate(w io.Writer, tmpl string, v any) error {
	t, err := template.New("format").Option("missingkey=zero").Funcs(template.FuncMap{
		"json": func(x any) (string, error) { b, err := json.Marshal(x); return string(b), err },
		"join": func(sep string, xs []any) string {
			s := make([]string, len(xs))
			for i, x := range xs {
				s[i] = fmt.Sprint(x)
			}
			return strings.Join(s, sep)
		},
	}).Parse(tmpl)
	if err != nil {
		return usagef("--format: %v", err)
	}
	data, err := asJSONValue(v)
	if err != nil {
		return err
	}
	items := []any{data}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
		items, _ = data.([]any)
	}
	var buf bytes.Buffer
	for _, it := range items {
		if err := t.Execute(&buf, it); err != nil {
			return usagef("--format: %v", err)
		}
		buf.WriteByte('\n')
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// errorDocument is what `-o json` prints on stderr for a failed command: the API's error
// shape, with the code of the error's class ("usage" for a bad command line) and the exit
// code the command exits with.
type errorDocument struct {
	Error struct {
		api.Error
		Exit int `json:"exit"`
	} `json:"error"`
}

// errorCode returns the API code of err's class, and its message without the class's own
// words at the end, which the code printed in front of it says ("pool \"p\" already exists:
// already exists" -> "conflict: pool \"p\" already exists").
func errorCode(err error) (code, msg string) {
	code, _ = api.FromError(err)
	msg = err.Error()
	for _, cl := range api.Classes {
		words := cl.Err.Error()
		if s := strings.TrimSuffix(msg, ": "+words); cl.Is(err) && s != msg {
			msg = s // the code says it: "conflict: pool \"p\" already exists", not "...: already exists" again
			break
		}
	}
	return code, msg
}

// printError reports err on stderr: `deltabox: CODE: message` (the code only when the error
// has an API class), or a JSON document with -o json.
func printError(stderr io.Writer, err error, exit int, asJSON bool) {
	code, msg := errorCode(err)
	var usage usageError
	if errors.As(err, &usage) {
		code = "usage"
	}
	if asJSON {
		var doc errorDocument
		doc.Error.Code, doc.Error.Message, doc.Error.Exit = code, msg, exit
		_ = json.NewEncoder(stderr).Encode(doc)
		return
	}
	switch code {
	case "usage":
		fmt.Fprintf(stderr, "deltabox: %s\nRun 'deltabox --help' for usage.\n", msg)
	case api.CodeInternal:
		fmt.Fprintf(stderr, "deltabox: %s\n", msg)
	default:
		fmt.Fprintf(stderr, "deltabox: %s: %s\n", code, msg)
	}
}

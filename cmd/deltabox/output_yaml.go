//go:build !cli

package main

import (
	"encoding/json"
	"io"
	"strings"

	"gopkg.in/yaml.v3"
)

// -o yaml is printed by the full build only: the cli build hands it over (lite_cli.go).

// printYAML prints v's JSON form as block YAML, keeping the JSON field order.
func printYAML(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil { // JSON is YAML
		return err
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle drops the flow and quoting styles a JSON document decodes with; the encoder
// quotes the strings that need it.
func blockStyle(n *yaml.Node) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!str" {
		n.Style = 0
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.Contains(n.Value, "\n") {
		n.Style = yaml.LiteralStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

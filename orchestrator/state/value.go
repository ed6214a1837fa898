package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
)

// Values in the document are what encoding/json decodes into an any with UseNumber:
// map[string]any, []any, string, json.Number, bool and nil. Numbers stay json.Number so that
// they round-trip exactly (no float64 rounding of large integers or long decimals).

// decodeValue decodes exactly one JSON value from raw.
func decodeValue(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("decode JSON: trailing data after the value")
	}
	return v, nil
}

// encode returns the canonical encoding of v: compact, object keys sorted, no HTML escaping.
// The document's size limit is measured in this encoding.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	b := buf.Bytes()
	return b[:len(b)-1], nil // drop Encode's newline
}

// keyLen is the length of k's encoding as an object key (quotes and escapes included).
func keyLen(k string) int64 {
	b, err := encode(k)
	if err != nil { // a string always encodes
		return int64(len(k) + 2)
	}
	return int64(len(b))
}

// deepCopy returns a copy of v that shares no maps or slices with it.
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = deepCopy(e)
		}
		return a
	default:
		return v
	}
}

// deepEqual is JSON equality as RFC 6902 "test" defines it: same type, numbers numerically
// equal, objects with the same members (order irrelevant), arrays element by element.
func deepEqual(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		return ok && mapsEqual(a, bm)
	case []any:
		ba, ok := b.([]any)
		return ok && slicesEqual(a, ba)
	case json.Number:
		bn, ok := b.(json.Number)
		return ok && numbersEqual(a, bn)
	default:
		return a == b // string, bool, nil
	}
}

func mapsEqual(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !deepEqual(av, bv) {
			return false
		}
	}
	return true
}

func slicesEqual(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !deepEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// numbersEqual compares two JSON number literals exactly ("1", "1.0" and "10e-1" are equal),
// without float rounding and without materialising huge exponents.
func numbersEqual(a, b json.Number) bool {
	if a == b {
		return true
	}
	na, okA := normalizeNumber(string(a))
	nb, okB := normalizeNumber(string(b))
	return okA && okB && na == nb
}

// maxExpDigits bounds the exponents normalizeNumber handles, so that "test" stays cheap.
const maxExpDigits = 18

// normalizeNumber rewrites a JSON number as sign, significant digits and exponent, so equal
// values get equal strings: "-12.50e1" -> "-125e0", "0.0" -> "0".
func normalizeNumber(s string) (string, bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expStr, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	expStr = strings.TrimPrefix(expStr, "+")
	if len(strings.TrimLeft(strings.TrimPrefix(expStr, "-"), "0")) > maxExpDigits {
		return "", false // absurd exponent: such numbers compare by their literal only
	}
	exp := new(big.Int)
	if expStr != "" {
		if _, ok := exp.SetString(expStr, 10); !ok {
			return "", false
		}
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	exp.Sub(exp, big.NewInt(int64(len(frac))))
	if digits == "" {
		return "0", true
	}
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + trimmed + "e" + exp.String(), true
}

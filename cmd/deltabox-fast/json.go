package main

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A small JSON reader and string writer: encoding/json's reflection and package state cost
// ~35 page faults per call (~1 ms here), and the front reads three shapes only (a lease, an
// error body, exec's event lines). Values decode to map[string]any, []any, string, bool, nil
// and number (the literal's text).

// number is a JSON number as written.
type number string

var errSyntax = errors.New("invalid character in JSON")

// parseJSON decodes one JSON value that makes up the whole of data (spaces aside).
func parseJSON(data []byte) (any, error) {
	p := jsonParser{data: data}
	v, err := p.value()
	if err == nil {
		p.space()
		if p.i != len(p.data) {
			err = errSyntax
		}
	}
	return v, err
}

type jsonParser struct {
	data []byte
	i    int
}

func (p *jsonParser) space() {
	for p.i < len(p.data) && (p.data[p.i] == ' ' || p.data[p.i] == '\t' || p.data[p.i] == '\n' || p.data[p.i] == '\r') {
		p.i++
	}
}

func (p *jsonParser) value() (any, error) {
	p.space()
	if p.i >= len(p.data) {
		return nil, errors.New("unexpected end of JSON input")
	}
	switch b := p.data[p.i]; {
	case b == '{':
		return p.object()
	case b == '[':
		return p.array()
	case b == '"':
		return p.str()
	case b == '-' || '0' <= b && b <= '9':
		start := p.i
		for p.i < len(p.data) && (p.data[p.i] == '-' || p.data[p.i] == '+' || p.data[p.i] == '.' || p.data[p.i] == 'e' ||
			p.data[p.i] == 'E' || '0' <= p.data[p.i] && p.data[p.i] <= '9') {
			p.i++
		}
		return number(p.data[start:p.i]), nil
	}
	for _, lit := range []struct {
		s string
		v any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if len(p.data)-p.i >= len(lit.s) && string(p.data[p.i:p.i+len(lit.s)]) == lit.s {
			p.i += len(lit.s)
			return lit.v, nil
		}
	}
	return nil, errSyntax
}

func (p *jsonParser) object() (any, error) {
	m := map[string]any{}
	p.i++ // {
	p.space()
	if p.i < len(p.data) && p.data[p.i] == '}' {
		p.i++
		return m, nil
	}
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return nil, errSyntax
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != ':' {
			return nil, errSyntax
		}
		p.i++
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		m[k] = v
		if done, err := p.next('}'); done || err != nil {
			return m, err
		}
	}
}

func (p *jsonParser) array() (any, error) {
	var a []any
	p.i++ // [
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		p.i++
		return a, nil
	}
	for {
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		if done, err := p.next(']'); done || err != nil {
			return a, err
		}
	}
}

// next reads the comma between members, or the closing byte (done).
func (p *jsonParser) next(closing byte) (bool, error) {
	p.space()
	switch {
	case p.i >= len(p.data):
		return false, errSyntax
	case p.data[p.i] == ',':
		p.i++
		return false, nil
	case p.data[p.i] == closing:
		p.i++
		return true, nil
	}
	return false, errSyntax
}

func (p *jsonParser) str() (string, error) {
	p.i++ // "
	var out []byte
	for p.i < len(p.data) {
		b := p.data[p.i]
		switch {
		case b == '"':
			p.i++
			return string(out), nil
		case b == '\\':
			if p.i+1 >= len(p.data) {
				return "", errSyntax
			}
			p.i += 2
			switch e := p.data[p.i-1]; e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", errSyntax
				}
				if utf16.IsSurrogate(r) {
					r2 := rune(-1)
					if p.i+1 < len(p.data) && p.data[p.i] == '\\' && p.data[p.i+1] == 'u' {
						save := p.i
						p.i += 2
						if r2, ok = p.hex4(); !ok {
							p.i, r2 = save, -1
						}
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						r = dec
					} else {
						r = utf8.RuneError
						if r2 >= 0 {
							p.i -= 6 // not a pair: the second escape is read on its own
						}
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", errSyntax
			}
		case b < 0x20:
			return "", errSyntax
		default:
			out = append(out, b)
			p.i++
		}
	}
	return "", errors.New("unexpected end of JSON input")
}

func (p *jsonParser) hex4() (rune, bool) {
	if p.i+4 > len(p.data) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.data[p.i:p.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(n), true
}

// appendJSONString appends s as a JSON string, escaped as encoding/json escapes it
// (<, > and & as \u00XX, invalid UTF-8 as U+FFFD, U+2028 and U+2029).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// Accessors of decoded objects: the zero value when absent or of another type.

func getString(m map[string]any, k string) string { s, _ := m[k].(string); return s }
func getBool(m map[string]any, k string) bool     { b, _ := m[k].(bool); return b }
func getObject(m map[string]any, k string) map[string]any {
	o, _ := m[k].(map[string]any)
	return o
}

func getInt(m map[string]any, k string) int {
	n, _ := m[k].(number)
	i, _ := strconv.Atoi(string(n))
	return i
}

// reencode appends the JSON value that makes up the whole of src as encoding/json prints the
// Go value decoded from it: compact (an Encoder's Encode) or indented by two spaces
// (json.NewEncoder with SetIndent("", "  ")), members in the order they came, each string
// decoded and escaped again as encoding/json escapes (so "\ufffd" comes out as the
// character, "<" as "\u003c"). Numbers and literals are kept as written: the daemon writes
// them with encoding/json from the same Go types the CLI decodes them into, and a Go float
// or integer prints back as it was read. No newline is added.
func reencode(dst, src []byte, indent bool) ([]byte, error) {
	p := jsonParser{data: src}
	dst, err := p.reencode(dst, indent, "\n")
	if err == nil {
		p.space()
		if p.i != len(p.data) {
			err = errSyntax
		}
	}
	return dst, err
}

// reencode copies one value; nl is the newline and indent of the value's line.
func (p *jsonParser) reencode(dst []byte, indent bool, nl string) ([]byte, error) {
	p.space()
	if p.i >= len(p.data) {
		return dst, errors.New("unexpected end of JSON input")
	}
	switch b := p.data[p.i]; b {
	case '"':
		s, err := p.str()
		return appendJSONString(dst, s), err
	case '{', '[':
		closing := byte('}')
		if b == '[' {
			closing = ']'
		}
		dst = append(dst, b)
		p.i++
		p.space()
		if p.i < len(p.data) && p.data[p.i] == closing {
			p.i++
			return append(dst, closing), nil
		}
		inner := nl + "  "
		for first := true; ; first = false {
			if !first {
				dst = append(dst, ',')
			}
			if indent {
				dst = append(dst, inner...)
			}
			if b == '{' {
				p.space()
				if p.i >= len(p.data) || p.data[p.i] != '"' {
					return dst, errSyntax
				}
				k, err := p.str()
				if err != nil {
					return dst, err
				}
				dst = append(appendJSONString(dst, k), ':')
				if indent {
					dst = append(dst, ' ')
				}
				p.space()
				if p.i >= len(p.data) || p.data[p.i] != ':' {
					return dst, errSyntax
				}
				p.i++
			}
			var err error
			if dst, err = p.reencode(dst, indent, inner); err != nil {
				return dst, err
			}
			done, err := p.next(closing)
			if err != nil {
				return dst, err
			}
			if done {
				break
			}
		}
		if indent {
			dst = append(dst, nl...)
		}
		return append(dst, closing), nil
	}
	start := p.i
	if _, err := p.value(); err != nil {
		return dst, err
	}
	return append(dst, p.data[start:p.i]...), nil
}

// getNum is a number member's text as written, "0" when absent (a Go integer prints so).
func getNum(m map[string]any, k string) string {
	if n, ok := m[k].(number); ok {
		return string(n)
	}
	return "0"
}

// getMS is a float member printed as %.2f.
func getMS(m map[string]any, k string) string {
	f, _ := strconv.ParseFloat(getNum(m, k), 64)
	return strconv.FormatFloat(f, 'f', 2, 64)
}

// rawMember is the text of member k of the JSON object data (nil when absent or malformed).
func rawMember(data []byte, k string) []byte {
	p := jsonParser{data: data}
	p.space()
	if p.i >= len(p.data) || p.data[p.i] != '{' {
		return nil
	}
	p.i++
	var found []byte
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return nil
		}
		name, err := p.str()
		p.space()
		if err != nil || p.i >= len(p.data) || p.data[p.i] != ':' {
			return nil
		}
		p.i++
		p.space()
		start := p.i
		if _, err := p.value(); err != nil {
			return nil
		}
		if name == k {
			found = p.data[start:p.i] // the last one wins, as in encoding/json
		}
		if done, err := p.next('}'); err != nil || done {
			return found
		}
	}
}

func getArray(m map[string]any, k string) []any { a, _ := m[k].([]any); return a }

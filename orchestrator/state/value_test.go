package state

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestNumbersEqual(t *testing.T) {
	cases := []struct {
		a, b string
		want bool
	}{
		{"1", "1.0", true},
		{"1", "10e-1", true},
		{"-0", "0.0e5", true},
		{"1500", "1.5e3", true},
		{"1500", "1.5E+3", true},
		{"123456789012345678901234567890", "1.2345678901234567890123456789e29", true},
		{"123456789012345678901234567890", "123456789012345678901234567891", false},
		{"0.1", "0.10000000000000000000001", false},
		{"-1", "1", false},
		{"1e" + strings.Repeat("9", 40), "1e" + strings.Repeat("9", 40), true},
		{"1e" + strings.Repeat("9", 40), "10e" + strings.Repeat("9", 40), false},
	}
	for _, c := range cases {
		if got := numbersEqual(json.Number(c.a), json.Number(c.b)); got != c.want {
			t.Errorf("numbersEqual(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestPointerRoundTrip(t *testing.T) {
	for _, s := range []string{"", "/", "//", "/a~0b~1c", "/~01", "/a/0/-"} {
		p, err := parsePointer(s)
		if err != nil {
			t.Fatalf("parsePointer(%q): %v", s, err)
		}
		if p.String() != s {
			t.Errorf("parsePointer(%q).String() = %q", s, p.String())
		}
	}
	if p, _ := parsePointer("/~01"); p[0] != "~1" {
		t.Errorf(`"/~01" decodes to %q, want "~1"`, p[0])
	}
}

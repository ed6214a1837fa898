package orchestrator

import (
	"testing"

	"github.com/containerd/errdefs"
)

func TestRestorePolicy(t *testing.T) {
	const pool = "version: 1\ndefault: deny\nrules:\n  - host: api.example.com\n    action: pass\n"
	const local = "version: 1\ndefault: deny\nrules:\n  - host: 127.0.0.1\n    action: pass\n"
	narrow := "version: 1\ndefault: deny\nrules:\n  - host: api.example.com\n    path_prefix: /admin\n    action: deny\n  - host: api.example.com\n    action: pass\n"
	cases := []struct {
		name, snap, pool, want string
		refused                bool
	}{
		{"same as the pool", pool, pool, "", false},
		{"extra deny in front", narrow, pool, narrow, false},
		{"reaches the host's loopback", local, pool, "", true},
		{"wider default", "version: 1\ndefault: pass\nrules:\n  - host: api.example.com\n    action: pass\n", pool, "", true},
		{"a pass rule against the built-in default", local, "", "", true},
		{"deny-all against the built-in default", "version: 1\ndefault: deny\n", "", "version: 1\ndefault: deny\n", false},
		{"pool rules reordered under a deny", "version: 1\nrules:\n  - host: 127.0.0.1\n    action: pass\n  - host: api.example.com\n    action: pass\n", pool, "", true},
	}
	for _, c := range cases {
		got, err := restorePolicy(c.snap, c.pool)
		if c.refused {
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s: want failed_precondition, got %q, %v", c.name, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

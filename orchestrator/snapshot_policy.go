package orchestrator

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/containerd/errdefs"
	"gopkg.in/yaml.v3"
)

// genericPolicy is an egress policy document read without interpretation, for comparing the
// rules of two policies as written.
type genericPolicy struct {
	Version int              `yaml:"version"`
	Default string           `yaml:"default"`
	Rules   []map[string]any `yaml:"rules"`
}

func readGeneric(doc string) (genericPolicy, error) {
	var g genericPolicy
	if err := yaml.Unmarshal([]byte(doc), &g); err != nil {
		return g, err
	}
	if g.Default == "" {
		g.Default = "deny" // proxy.ParsePolicy's default
	}
	return g, nil
}

// restorePolicy decides the egress policy of a sandbox restored from a snapshot whose lease had
// policy snap into a pool whose sandboxes get policy pool ("" = the proxy's built-in
// default). The restored sandbox never gets more than the pool allows: it keeps the pool's
// policy when snap is the same, snap when snap is provably narrower, and the restore is
// refused otherwise. It returns the lease override to apply ("" = the pool's).
func restorePolicy(snap, pool string) (string, error) {
	if strings.TrimSpace(snap) == strings.TrimSpace(pool) {
		return "", nil
	}
	if err := ValidatePolicy(snap); err != nil {
		return "", fmt.Errorf("the snapshot's egress policy: %w", err)
	}
	ok, err := narrower(snap, pool)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("the snapshot's egress policy is not the pool's and not provably narrower (only extra deny rules in front of the pool's rules, and the same or a deny default, may narrow it); restoring it would widen what the pool's sandboxes may reach: restore into a pool with that policy: %w",
			errdefs.ErrFailedPrecondition)
	}
	return snap, nil
}

// narrower reports whether policy a allows no request that policy b does not: a is b's rules
// with only deny rules added in front, and a's default is b's or deny (first match wins, so a
// request either hits an added deny or is decided as b decides it). Against the built-in
// default (b == ""), a must deny everything.
func narrower(a, b string) (bool, error) {
	ga, err := readGeneric(a)
	if err != nil {
		return false, fmt.Errorf("the snapshot's egress policy: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if strings.TrimSpace(b) == "" {
		return ga.Default == "deny" && allDeny(ga.Rules), nil
	}
	gb, err := readGeneric(b)
	if err != nil {
		return false, fmt.Errorf("the pool's egress policy: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if ga.Default != gb.Default && ga.Default != "deny" {
		return false, nil
	}
	extra := len(ga.Rules) - len(gb.Rules)
	if extra < 0 || !allDeny(ga.Rules[:extra]) {
		return false, nil
	}
	return reflect.DeepEqual(ga.Rules[extra:], gb.Rules) || (len(gb.Rules) == 0 && extra == len(ga.Rules)), nil
}

func allDeny(rules []map[string]any) bool {
	for _, r := range rules {
		if r["action"] != "deny" {
			return false
		}
	}
	return true
}

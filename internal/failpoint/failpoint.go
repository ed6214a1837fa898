// Package failpoint lets tests make the daemon fail or die at named points of an operation
// ("rollback/after-files"), to check that every crash and error leaves one known outcome.
//
// Failpoints are enabled by the DELTABOX_FAILPOINTS environment variable, read once at start
// ("rollback/after-files=exit,commit/before-send=error"), or by Enable in a test. When none is
// enabled, Inject costs one atomic load. Actions:
//
//	exit        the process exits at once with status 137 (as if killed with SIGKILL)
//	error       Inject returns an error wrapping ErrInjected
//	panic       Inject panics
//	sleep(MS)   Inject sleeps MS milliseconds, then returns nil
//	off         disabled
//
// An action may be prefixed with a count, "2*error": the point acts on its first two hits
// only. Production code calls Inject at the point and returns its error.
package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EnvVar is the environment variable read at start.
const EnvVar = "DELTABOX_FAILPOINTS"

// ExitCode is the status an "exit" failpoint exits with (128 + SIGKILL).
const ExitCode = 137

// ErrInjected is wrapped by the error an "error" failpoint returns.
var ErrInjected = errors.New("injected failure")

type kind int

const (
	kindError kind = iota
	kindExit
	kindPanic
	kindSleep
)

type action struct {
	kind  kind
	sleep time.Duration
	left  atomic.Int64 // hits left; < 0: unlimited
}

var (
	mu     sync.Mutex
	active atomic.Pointer[map[string]*action] // nil: no failpoint enabled
)

func init() {
	if spec := os.Getenv(EnvVar); spec != "" {
		if err := Set(spec); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", EnvVar, err)
			os.Exit(2)
		}
	}
}

// Inject runs the failpoint name's action if it is enabled; it returns nil otherwise.
func Inject(name string) error {
	m := active.Load()
	if m == nil {
		return nil
	}
	a := (*m)[name]
	if a == nil {
		return nil
	}
	if !a.take() {
		return nil
	}
	switch a.kind {
	case kindExit:
		fmt.Fprintf(os.Stderr, "failpoint %s: exit %d\n", name, ExitCode)
		os.Exit(ExitCode)
	case kindPanic:
		panic("failpoint " + name)
	case kindSleep:
		time.Sleep(a.sleep)
		return nil
	}
	return fmt.Errorf("failpoint %s: %w", name, ErrInjected)
}

// take reports whether a hit acts: always when unlimited, else while hits are left (the
// count stops at 0, never wrapping to the unlimited -1).
func (a *action) take() bool {
	for {
		n := a.left.Load()
		if n < 0 {
			return true
		}
		if n == 0 {
			return false
		}
		if a.left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// Set enables the failpoints of spec ("name=action,name=action"), replacing none of the
// others; "name=off" disables one.
func Set(spec string) error {
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, act, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return fmt.Errorf("failpoint %q: want name=action", item)
		}
		if err := Enable(strings.TrimSpace(name), strings.TrimSpace(act)); err != nil {
			return err
		}
	}
	return nil
}

// Enable sets the action of failpoint name ("off" disables it).
func Enable(name, act string) error {
	var a *action
	if act != "off" {
		var err error
		if a, err = parseAction(act); err != nil {
			return fmt.Errorf("failpoint %s: %w", name, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	next := map[string]*action{}
	if m := active.Load(); m != nil {
		for k, v := range *m {
			next[k] = v
		}
	}
	if a == nil {
		delete(next, name)
	} else {
		next[name] = a
	}
	if len(next) == 0 {
		active.Store(nil)
	} else {
		active.Store(&next)
	}
	return nil
}

// Reset disables every failpoint.
func Reset() {
	mu.Lock()
	defer mu.Unlock()
	active.Store(nil)
}

func parseAction(s string) (*action, error) {
	a := &action{}
	a.left.Store(-1)
	if n, rest, ok := strings.Cut(s, "*"); ok {
		c, err := strconv.Atoi(n)
		if err != nil || c < 1 {
			return nil, fmt.Errorf("count %q: want a positive number", n)
		}
		a.left.Store(int64(c))
		s = rest
	}
	switch {
	case s == "exit":
		a.kind = kindExit
	case s == "error":
		a.kind = kindError
	case s == "panic":
		a.kind = kindPanic
	case strings.HasPrefix(s, "sleep(") && strings.HasSuffix(s, ")"):
		ms, err := strconv.Atoi(s[len("sleep(") : len(s)-1])
		if err != nil || ms < 0 {
			return nil, fmt.Errorf("action %q: want sleep(milliseconds)", s)
		}
		a.kind, a.sleep = kindSleep, time.Duration(ms)*time.Millisecond
	default:
		return nil, fmt.Errorf("action %q: want exit, error, panic, sleep(MS) or off", s)
	}
	return a, nil
}

//go:build !cli

package main

import (
	"net/url"
	"strings"
)

// defaultTaskQueue is the task queue a run uses unless --engine names one (the workers'
// default, pipeline/temporal.DefaultQueue).
const defaultTaskQueue = "deltabox"

// engineSpec is a parsed --engine temporal://HOST:PORT[/NAMESPACE][?task_queue=Q&tls=1].
type engineSpec struct {
	address, namespace, queue string
	tls                       bool
	serverName                string
}

// parseEngine reads --engine: nil for the local engine.
func parseEngine(o runOptions) (*engineSpec, error) {
	if o.engine == "" || o.engine == "local" {
		return nil, nil
	}
	u, err := url.Parse(o.engine)
	if err != nil || u.Scheme != "temporal" || u.Host == "" || u.Port() == "" {
		return nil, usagef("--engine %q: want local or temporal://HOST:PORT[/NAMESPACE][?task_queue=Q&tls=1]", o.engine)
	}
	if o.logDir != "" {
		return nil, usagef("--log-dir: the output of a task on Temporal stays on the node that ran it; drop --log-dir with --engine temporal")
	}
	e := &engineSpec{address: u.Host, namespace: strings.Trim(u.Path, "/"), queue: defaultTaskQueue, serverName: q0(u, "tls_server_name")}
	q := u.Query()
	for k := range q {
		if k != "task_queue" && k != "tls" && k != "tls_server_name" {
			return nil, usagef("--engine %q: unknown parameter %q (known: task_queue, tls, tls_server_name)", o.engine, k)
		}
	}
	if v := q.Get("task_queue"); v != "" {
		e.queue = v
	}
	switch q.Get("tls") {
	case "", "0", "false":
	case "1", "true":
		e.tls = true
	default:
		return nil, usagef("--engine %q: tls=%q: want 1 or 0", o.engine, q.Get("tls"))
	}
	return e, nil
}

// q0 is the first value of query parameter k of u.
func q0(u *url.URL, k string) string { return u.Query().Get(k) }

// Package temporal runs pipelines (package pipeline) on Temporal, spread over many DeltaBox
// nodes: every task is one workflow (TaskWorkflow) whose activities run on the node that
// holds the task's sandbox, and a task whose node dies continues on another node from its
// last L3 failover point (or from the start).
//
// Two sides use it. The daemon runs a Worker (StartWorker) when its config has a [temporal]
// section: it polls a shared task queue for new tasks only while it has capacity (Temporal
// worker sessions, at most MaxTasks at once) and runs the activities of the tasks it took
// through its own API socket (orchestrator/client), so this package links no daemon-side
// package. `deltabox run --engine temporal://HOST:PORT` runs Run: it starts one workflow per
// task under a deterministic workflow ID (a restarted run picks the running workflows up)
// and reports the results as a local run does.
//
// Node loss: every activity of a task runs in one session; when its node stops
// heartbeating the session fails and the workflow acquires a sandbox again on any node
// with capacity, by restoring the task's last failover point, an L3 snapshot pushed to the
// shared object store after the steps the pipeline names (`failover: l3 every N steps`,
// or `failover: l3` on a step) and before every commit of a pipeline that has failover
// points. The snapshot carries the effect journal, so held effects are committed once,
// from the node that ends the task, under the Idempotency-Key they always had.
package temporal

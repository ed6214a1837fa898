// Package pipeline runs batch agent pipelines against a DeltaBox daemon: a YAML file names a
// pool and a list of steps, a JSON-lines file lists tasks, and every task leases a sandbox,
// runs the steps with a checkpoint before each one, retries or falls back on failure by
// rolling back to that checkpoint, commits held effects per step or per task, and records one
// result line per task (so an interrupted run can resume).
//
// The same files run across many nodes on Temporal (package pipeline/temporal, engine.go here
// is what it uses); `failover: l3 every N steps` (or `failover: l3` on a step) asks that engine
// for L3 failover points and is ignored by a local run.
//
// It owns the pipeline file format (Parse, Load), task reading (ReadTasks), the per-task step
// engine (Run) and the result and summary records. It is a CLIENT-side engine: it talks to the
// daemon only through the small Client interface below (satisfied by
// *orchestrator/client.Client) and uses the API's wire types; it must not import the
// orchestrator, pool, overlay, proxy or any other daemon-side package, and it never parses
// command lines (cmd/deltabox does).
//
// Randomness and time: every task gets a deterministic seed (from the pipeline's seed and the
// task's index) and a start time, passed to every attempt of every step as DELTABOX_SEED,
// PYTHONHASHSEED and DELTABOX_TASK_START, so a retried step sees the same inputs unless it sets
// fresh_random. The clock itself is NOT virtualised: time namespaces cannot be entered by an
// already running container, so agents that want a reproducible "now" must read
// DELTABOX_TASK_START instead of the wall clock.
package pipeline

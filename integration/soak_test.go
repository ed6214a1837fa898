package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/client"
)

// The soak (issue 12): N sandboxes run steps of write, state patch, held POST, checkpoint,
// then 30% rollback to a random checkpoint after the commit point or 25% commit, while the
// daemon is killed with SIGKILL every ~20 s and restarted. Each worker models the files,
// state and effects every checkpoint must have; an operation cut by a kill leaves an unknown
// outcome that the worker resolves from what the restarted daemon lists (checkpoints, commit
// point) and a rollback to the latest listed checkpoint. At the end every checkpoint is rolled
// back to (newest first, forced past the commit point) and compared with its model, and the
// upstream must have seen exactly the committed steps' POSTs, each under one key.
//
// DELTABOX_SOAK_SANDBOXES and DELTABOX_SOAK_DURATION size it (`make test-soak`: 15 x 3m);
// without them it runs 3 sandboxes for 20 s.

// soakModel is what one checkpoint holds: the steps on its chain (files, state and effects
// all derive from them).
type soakModel struct {
	id    string
	steps []int
}

// soakWorker drives one sandbox.
type soakWorker struct {
	t      *testing.T
	c      *client.Client
	id     string
	k      int
	u      *upstream
	rng    *rand.Rand
	ckpts  []soakModel // listed checkpoints, oldest first
	live   []int       // steps of the live sandbox (a checkpoint's steps plus the step in progress)
	commit string      // the commit point, "" before any commit

	steps, commits, rollbacks, resyncs, checked, mismatches atomic.Int64
}

func soakSize() (int, time.Duration) {
	n := envInt("DELTABOX_SOAK_SANDBOXES", 3)
	dur := 20 * time.Second
	if v := os.Getenv("DELTABOX_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			panic(fmt.Sprintf("DELTABOX_SOAK_DURATION=%q: %v", v, err))
		}
		dur = d
	}
	return n, dur
}

func TestSoakKill9(t *testing.T) {
	n, dur := soakSize()
	u := startUpstream(t)
	d := startDaemonWith(t, fmt.Sprintf("[egress]\nupstream_ca_file = %q\n", u.ca))
	policy := shortTempDir(t) + "/policy.yaml"
	os.WriteFile(policy, []byte(egressPolicy), 0o644)
	d.cli("pool", "create", "net", "--image", pythonImage, "--min-ready", fmt.Sprint(n), "--max", fmt.Sprint(n+5), "--egress-policy", policy)
	d.waitReady("net", n, time.Duration(n)*30*time.Second)
	workers := make([]*soakWorker, n)
	for k := range workers {
		w := &soakWorker{t: t, c: d.client(), id: d.lease("net", noProxyBypass...).ID, k: k, u: u,
			rng: rand.New(rand.NewPCG(uint64(k), uint64(time.Now().UnixNano())))}
		for _, ck := range d.checkpointIDs(w.id) {
			w.ckpts = append(w.ckpts, soakModel{id: ck})
		}
		workers[k] = w
	}
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(stop) }()
	}
	kills := 0
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	every := min(20*time.Second, dur/4) // ~20 s; a short soak kills more often to kill at all
	for {
		wait := every*3/4 + time.Duration(rng.Int64N(int64(every/2)))
		if time.Now().Add(wait).After(stop) {
			break
		}
		time.Sleep(wait)
		d.kill()
		kills++
		d.start()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Cleanup(func() {
		if t.Failed() { // what the sandboxes' inits said, before the cleanups remove them
			logs, _ := filepath.Glob(filepath.Join(d.root, "pool", "containers", "*", "init.log"))
			for _, l := range logs {
				data, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", l, data[max(0, len(data)-1500):])
			}
		}
	})
	var steps, commits, rollbacks, resyncs, toured, checked, mismatches, committed int64
	for _, w := range workers {
		toured += int64(w.finish())
		checked, mismatches = checked+w.checked.Load(), mismatches+w.mismatches.Load()
		committed += int64(len(w.committedSteps()))
		steps, commits, rollbacks, resyncs = steps+w.steps.Load(), commits+w.commits.Load(), rollbacks+w.rollbacks.Load(), resyncs+w.resyncs.Load()
	}
	distinct, total := 0, 0
	u.mu.Lock()
	for k, keys := range u.keys {
		if !strings.HasPrefix(k, "POST /soak/") {
			continue
		}
		total += len(keys)
		seen := map[string]bool{}
		for _, key := range keys {
			seen[key] = true
		}
		distinct += len(seen)
		if len(seen) != 1 {
			t.Errorf("%s reached the upstream under %d keys %q, want one", k, len(seen), keys)
		}
	}
	u.mu.Unlock()
	for _, w := range workers {
		w.checkUpstream()
	}
	t.Logf("soak: %d sandboxes x %s: %d kills, %d steps, %d commits, %d rollbacks, %d resyncs after kills; %d checkpoints rolled back to at the end, %d contents checked in all, %d mismatches; %d committed steps; upstream: %d distinct keys, %d deliveries",
		n, dur, kills, steps, commits, rollbacks, resyncs, toured, checked, mismatches, committed, distinct, total)
	if int64(distinct) != committed {
		t.Errorf("upstream saw %d distinct effects, want the %d committed steps", distinct, committed)
	}
}

// run does steps until stop; an error (the daemon was killed) makes the worker resync.
func (w *soakWorker) run(stop time.Time) {
	for i := 1; time.Now().Before(stop) && !w.t.Failed(); i++ {
		if err := w.step(i); err != nil {
			w.resync(err)
		}
	}
}

func (w *soakWorker) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Minute)
}

func (w *soakWorker) exec(argv ...string) (string, error) {
	ctx, cancel := w.ctx()
	defer cancel()
	var out, errOut bytes.Buffer
	st, err := w.c.Exec(ctx, w.id, api.ExecRequest{Argv: argv, TimeoutMS: 30_000}, nil, &out, &errOut)
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("%v: exit %d: %s %s", argv, st.Code, errOut.String(), st.Error)
	}
	return out.String(), err
}

func (w *soakWorker) path(step int) string { return fmt.Sprintf("/soak/%d/%d", w.k, step) }

func (w *soakWorker) step(i int) error {
	w.live = append(w.last().steps[:len(w.last().steps):len(w.last().steps)], i)
	out, err := w.exec("sh", "-c", fmt.Sprintf(`mkdir -p /root/soak && echo %d > /root/soak/file && echo %d >> /root/soak/log && curl -sS -m 20 -X POST -d x=%d %s%s`,
		i, i, i, w.u.plain.URL, w.path(i)))
	if err != nil {
		return err
	}
	if !strings.Contains(out, `"held":true`) {
		w.t.Errorf("sandbox %d step %d: POST not held: %q", w.k, i, out)
		return nil
	}
	ctx, cancel := w.ctx()
	defer cancel()
	if _, err := w.c.StatePatch(ctx, w.id, w.patch(w.live), -1); err != nil {
		return err
	}
	ck, err := w.c.Checkpoint(ctx, w.id, api.CheckpointRequest{})
	if err != nil {
		return err
	}
	w.ckpts = append(w.ckpts, soakModel{id: ck.ID, steps: w.live})
	w.live = nil
	w.steps.Add(1)
	switch r := w.rng.Float64(); {
	case r < 0.3:
		return w.rollback()
	case r < 0.55:
		res, err := w.c.Commit(ctx, w.id)
		if err != nil {
			return err
		}
		if res.EffectsFailed != 0 || res.Checkpoint != ck.ID {
			w.t.Errorf("sandbox %d: commit %+v, want checkpoint %s and nothing failed", w.k, res, ck.ID)
		}
		w.commit = ck.ID
		w.commits.Add(1)
	}
	return nil
}

// rollback rolls back to a random checkpoint after the commit point and checks the content.
func (w *soakWorker) rollback() error {
	first := w.index(w.commit) + 1
	if first >= len(w.ckpts) {
		return nil
	}
	j := first + w.rng.IntN(len(w.ckpts)-first)
	ctx, cancel := w.ctx()
	defer cancel()
	if _, err := w.c.Rollback(ctx, w.id, api.RollbackRequest{To: w.ckpts[j].id}); err != nil {
		return err
	}
	w.ckpts = w.ckpts[:j+1]
	w.rollbacks.Add(1)
	return w.check(w.ckpts[j])
}

func (w *soakWorker) last() soakModel { return w.ckpts[len(w.ckpts)-1] }

func (w *soakWorker) index(id string) int {
	for i, m := range w.ckpts {
		if m.id == id {
			return i
		}
	}
	return -1
}

func (w *soakWorker) patch(steps []int) []byte {
	ops := []map[string]any{{"op": "add", "path": "/step", "value": steps[len(steps)-1]},
		{"op": "add", "path": "/chain", "value": soakChain(steps)}}
	data, _ := json.Marshal(ops)
	return data
}

func soakChain(steps []int) string {
	s := make([]string, len(steps))
	for i, n := range steps {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// check compares the live sandbox's files and state with m.
func (w *soakWorker) check(m soakModel) error {
	out, err := w.exec("sh", "-c", `for f in /root/soak/file /root/soak/log; do if [ -e $f ]; then cat $f; else echo none; fi; done`)
	if err != nil {
		return err
	}
	ctx, cancel := w.ctx()
	defer cancel()
	raw, err := w.c.StateGet(ctx, w.id, "")
	if err != nil {
		return err
	}
	want := "none\nnone\n"
	wantStep, wantChain := any(nil), any(nil)
	if n := len(m.steps); n > 0 {
		want = fmt.Sprintf("%d\n%s\n", m.steps[n-1], strings.Join(strings.Split(soakChain(m.steps), ","), "\n"))
		wantStep, wantChain = float64(m.steps[n-1]), soakChain(m.steps)
	}
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	if out != want || doc["step"] != wantStep || doc["chain"] != wantChain {
		w.mismatches.Add(1)
		w.t.Errorf("sandbox %d at checkpoint %s: files %q state %s, want files %q state step %v chain %v",
			w.k, m.id, out, raw, want, wantStep, wantChain)
	}
	w.checked.Add(1)
	return nil
}

// resync waits for the daemon, learns what the cut operation did from the listed checkpoints
// and the commit point, and rolls the sandbox back to the latest listed checkpoint.
func (w *soakWorker) resync(cause error) {
	w.resyncs.Add(1)
	deadline := time.Now().Add(2 * time.Minute)
	for try := 0; ; try++ {
		if time.Now().After(deadline) {
			w.t.Errorf("sandbox %d: no resync within 2 minutes, cause %v", w.k, cause)
			return
		}
		if try > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		ctx, cancel := w.ctx()
		cks, err := w.c.Checkpoints(ctx, w.id)
		cancel()
		if err != nil {
			continue
		}
		if !w.adopt(cks) {
			return
		}
		ctx, cancel = w.ctx()
		_, err = w.c.Rollback(ctx, w.id, api.RollbackRequest{To: w.last().id, Force: w.last().id == w.commit})
		cancel()
		if err != nil {
			continue
		}
		if err := w.check(w.last()); err == nil {
			return
		}
	}
}

// adopt replaces the model's checkpoint list with the daemon's path from the first checkpoint
// to the head (rollbacks keep other branches, which the model forgets): a checkpoint the model
// does not know can only be the one whose create was cut (its content is the live steps).
func (w *soakWorker) adopt(all []api.Checkpoint) bool {
	cks := headPath(all)
	var next []soakModel
	for n, ck := range cks {
		i := w.index(ck.ID)
		switch {
		case i >= 0:
			next = append(next, w.ckpts[i])
		case len(w.live) > 0 && n == len(cks)-1:
			next = append(next, soakModel{id: ck.ID, steps: w.live})
			w.steps.Add(1)
		default:
			w.t.Errorf("sandbox %d: unknown checkpoint %+v after a kill (model %v)", w.k, ck, w.ckpts)
			return false
		}
		if ck.Committed {
			w.commit = ck.ID
		}
	}
	w.ckpts, w.live = next, nil
	return true
}

// headPath returns the checkpoints from the first one down to the head, following parents.
func headPath(all []api.Checkpoint) []api.Checkpoint {
	byID := map[string]api.Checkpoint{}
	head := ""
	for _, c := range all {
		byID[c.ID] = c
		if c.Head {
			head = c.ID
		}
	}
	var path []api.Checkpoint
	for id := head; id != ""; id = byID[id].Parent {
		c, ok := byID[id]
		if !ok {
			break
		}
		path = append([]api.Checkpoint{c}, path...)
	}
	return path
}

// finish commits the latest checkpoint, waits for every effect to be sent, then rolls back to
// every checkpoint (newest first) and checks its content; it returns how many it checked.
func (w *soakWorker) finish() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := w.c.Commit(ctx, w.id)
	if err != nil || res.EffectsFailed != 0 {
		w.t.Fatalf("sandbox %d: final commit: %+v, %v", w.k, res, err)
	}
	w.commit = res.Checkpoint
	deadline := time.Now().Add(2 * time.Minute)
	for {
		effects, err := w.c.Effects(ctx, w.id, "")
		pending := 0
		for _, e := range effects {
			if e.Status != "released" && e.Status != "dropped" {
				pending++
			}
		}
		if err == nil && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("sandbox %d: %d effects neither released nor dropped 2 minutes after the final commit (%v)", w.k, pending, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cks, err := w.c.Checkpoints(ctx, w.id)
	if err != nil || !w.adopt(cks) {
		w.t.Fatalf("sandbox %d: checkpoints at the end: %v", w.k, err)
	}
	checked := 0
	for j := len(w.ckpts) - 1; j >= 0; j-- {
		m := w.ckpts[j]
		if _, err := w.c.Rollback(ctx, w.id, api.RollbackRequest{To: m.id, Force: true}); err != nil {
			w.t.Fatalf("sandbox %d: rollback to %s: %v", w.k, m.id, err)
		}
		if err := w.check(m); err != nil {
			w.t.Fatalf("sandbox %d: check %s: %v", w.k, m.id, err)
		}
		checked++
	}
	return checked
}

// committedSteps are the steps on the chain of the commit point.
func (w *soakWorker) committedSteps() []int {
	for _, m := range w.ckpts {
		if m.id == w.commit {
			return m.steps
		}
	}
	return nil
}

// checkUpstream: the upstream saw this sandbox's committed steps' POSTs and no other.
func (w *soakWorker) checkUpstream() {
	want := map[string]bool{}
	for _, s := range w.committedSteps() {
		want["POST "+w.path(s)] = true
	}
	w.u.mu.Lock()
	defer w.u.mu.Unlock()
	prefix := fmt.Sprintf("POST /soak/%d/", w.k)
	for k := range w.u.keys {
		if strings.HasPrefix(k, prefix) && !want[k] {
			w.t.Errorf("sandbox %d: %s reached the upstream but its step was never committed (rolled back)", w.k, k)
		}
	}
	for k := range want {
		if len(w.u.keys[k]) == 0 {
			w.t.Errorf("sandbox %d: committed %s never reached the upstream", w.k, k)
		}
	}
}

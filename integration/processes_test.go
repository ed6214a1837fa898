package integration

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

//go:embed testdata/repl.py
var replPy string

// pipeShell is a process in the sandbox driven through two FIFOs in /dev/shm (a tmpfs,
// outside the checkpointed files), both opened read-write so that neither side sees EOF.
type pipeShell struct {
	d    *daemon
	id   string
	name string
}

// startPiped starts cmd in the background with stdin and stdout on /dev/shm/NAME.in and
// NAME.out.
func startPiped(d *daemon, id, name, cmd string) pipeShell {
	d.t.Helper()
	p := pipeShell{d: d, id: id, name: "/dev/shm/" + name}
	d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf(
		"rm -f %[1]s.in %[1]s.out; mkfifo %[1]s.in %[1]s.out; nohup %[2]s <>%[1]s.in 1<>%[1]s.out 2>&1 &", p.name, cmd))
	return p
}

// ask sends one line and returns the first answer line.
func (p pipeShell) ask(line string) string {
	p.d.t.Helper()
	out := p.d.cli("exec", p.id, "--", "sh", "-c", fmt.Sprintf(
		"printf '%%s\\n' %s > %s.in; timeout 10 head -n1 %s.out", shellQuote(line), p.name, p.name))
	return strings.TrimSpace(out)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'" }

// psCount counts the sandbox's running processes (not stopped for the tracer: templates
// are) whose command line is cmdline, the counting shell excluded.
func (d *daemon) psCount(id, cmdline string) (int, string) {
	d.t.Helper()
	out := d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf(`n=0; all=
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  c=$(tr '\0' ' ' <$p/cmdline 2>/dev/null); st=$(sed 's/.*) //' $p/stat 2>/dev/null | cut -c1)
  all="$all ${p#/proc/}:$st:$c;"
  case "$c" in "%s ") [ "$st" != t ] && n=$((n+1));; esac
done; echo "$n"; echo "$all"`, cmdline))
	first, rest, _ := strings.Cut(out, "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(first))
	return n, rest
}

// TestProcessTemplates checkpoints a sandbox with processes no one prepared for it (a
// Python REPL and a bash session driven through pipes, a process asleep, one blocked in a
// write to a full pipe, a parent with children, a process writing a file it keeps open),
// changes all of them, rolls back, checks every one is as at the checkpoint, and does it a
// second time to the same checkpoint.
func TestProcessTemplates(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /work && cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
	py := startPiped(d, id, "py", "python3 /repl.py")
	sh := startPiped(d, id, "sh", "bash")
	if got := py.ask("before = 41"); got != "'ok'" {
		t.Fatalf("REPL: %s", got)
	}
	py.ask("heap = bytearray(50 << 20)")
	sh.ask(`cd /etc; export EXP=one; UNEXP=two; f() { echo fn; }; sleep 1000 & echo started`)
	d.cli("exec", id, "--", "sh", "-c", `nohup sleep 999 >/dev/null 2>&1 &
		mkfifo /dev/shm/full; nohup yes 1<>/dev/shm/full 2>/dev/null &
		nohup sh -c 'sleep 998 & sleep 998 & wait' >/dev/null 2>&1 &
		nohup python3 -c 'import time
f = open("/work/log.txt", "w", buffering=1)
n = 0
while True:
    n += 1; f.write("%d\n" % n); time.sleep(0.02)' >/dev/null 2>&1 &
		sleep 0.3`)

	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes", "-m", "with processes")
	t.Logf("checkpoint with processes: frozen %.2f ms, total %.2f ms, template bytes %d", ck.FrozenMS, ck.TotalMS, ck.TemplateBytes)
	templated := 0
	for _, p := range ck.Processes {
		if p.Kept == api.KeptTemplate {
			templated++
		} else {
			t.Errorf("process not templated: %+v", p)
		}
	}
	if templated < 9 {
		t.Fatalf("%d processes templated, want at least 9 (python x2, bash, sleep x4, sh, yes): %+v", templated, ck.Processes)
	}

	for round := 1; round <= 2; round++ {
		// the step: every process changes
		py.ask("before = 0")
		py.ask("after = 1")
		sh.ask(`cd /; export EXP=changed; UNEXP=changed; unset -f f; echo changed`)
		time.Sleep(200 * time.Millisecond) // the writer writes on
		var rb api.RollbackResult
		d.cliJSON(&rb, "rollback", id, "--to", ck.ID)
		t.Logf("round %d: rollback frozen %.2f ms, total %.2f ms, %d stopped, %d restored, lost %v",
			round, rb.FrozenMS, rb.TotalMS, rb.ProcessesStopped, rb.ProcessesRestored, rb.ProcessesLost)
		if rb.ProcessesRestored != templated || len(rb.ProcessesLost) != 0 {
			t.Fatalf("round %d: %d processes restored, want %d; lost: %+v", round, rb.ProcessesRestored, templated, rb.ProcessesLost)
		}
		if got := py.ask("before"); got != "41" {
			t.Errorf("round %d: REPL before = %s, want 41", round, got)
		}
		if got := py.ask("after"); got != "'NameError'" {
			t.Errorf("round %d: REPL after = %s, want NameError (defined after the checkpoint)", round, got)
		}
		if got := py.ask("len(heap)"); got != strconv.Itoa(50<<20) {
			t.Errorf("round %d: REPL heap = %s", round, got)
		}
		if got := sh.ask(`echo "$(pwd) $EXP $UNEXP $(f) $(jobs | grep -c 'sleep 1000')"`); got != "/etc one two fn 1" {
			t.Errorf("round %d: bash says %q, want %q", round, got, "/etc one two fn 1")
		}
		for pat, want := range map[string]int{"sleep 999": 1, "sleep 998": 2, "sh -c sleep 998 & sleep 998 & wait": 1, "yes": 1, "sleep 1000": 1} {
			if n, all := d.psCount(id, pat); n != want {
				t.Errorf("round %d: %d processes %q, want %d: %s", round, n, pat, want, all)
			}
		}
		// The writer's copy continues the file from the checkpoint's offset: its lines stay
		// 1, 2, 3, ... (a wrong offset leaves a gap, NULs or repeats) and it grows.
		log1 := d.cli("exec", id, "--", "cat", "/work/log.txt")
		time.Sleep(200 * time.Millisecond)
		log2 := d.cli("exec", id, "--", "cat", "/work/log.txt")
		if !consecutive(log2) || len(log2) <= len(log1) {
			t.Errorf("round %d: the writer's file is not continued from the checkpoint (%d then %d bytes, consecutive %t):\n%.300s",
				round, len(log1), len(log2), consecutive(log2), log2)
		}
	}
}

// consecutive reports whether s is the lines 1, 2, 3, ... with nothing else.
func consecutive(s string) bool {
	for i, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if line != strconv.Itoa(i+1) {
			return false
		}
	}
	return true
}

//go:embed testdata/attack_templates.py
var attackTemplatesPy string

// templateAttack is what attack_templates.py reports.
type templateAttack struct {
	Templates []int                        `json:"templates"`
	Results   map[string]map[string]string `json:"results"`
}

// TestProcessTemplatesFromInside attacks the templates from inside the sandbox: they are
// found (stopped processes in /proc), but their memory can be neither read nor written,
// they cannot be traced, and signals do not reach them nor the copies made from them; a
// SIGKILL destroys one template, which the rollback then reports, and nothing else.
func TestProcessTemplatesFromInside(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1)
	l := d.lease("py")
	id := l.ID
	if !l.Isolation.UserNamespace { // templates must work, and hold, under user namespaces
		t.Fatalf("the default pool's sandbox has no user namespace: %+v", l.Isolation)
	}
	d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL\ncat > /attack.py <<'EOF_ATTACK'\n"+attackTemplatesPy+"\nEOF_ATTACK")
	py := startPiped(d, id, "py", "python3 /repl.py")
	d.cli("exec", id, "--", "sh", "-c", "nohup sleep 997 >/dev/null 2>&1 &")
	py.ask("secret = 7")
	var ck1, ck2 api.Checkpoint
	d.cliJSON(&ck1, "checkpoint", "create", id, "--processes")
	py.ask("secret = 8")
	d.cliJSON(&ck2, "checkpoint", "create", id, "--processes")
	t.Logf("checkpoint %s keeps %+v; checkpoint %s keeps %+v", ck1.ID, ck1.Processes, ck2.ID, ck2.Processes)

	var atk templateAttack
	out := d.cli("exec", id, "--", "python3", "/attack.py")
	if err := json.Unmarshal([]byte(out), &atk); err != nil {
		t.Fatalf("attack output %q: %v", out, err)
	}
	// The 4 templates, and the spare copies of checkpoint 2's two, when they are made
	// already (in the background, after the answer): they resist the same.
	if n := len(atk.Templates); n < 4 || n > 6 {
		t.Fatalf("the sandbox sees %d stopped processes, want the 4 templates and at most 2 spares: %s", n, out)
	}
	for pid, r := range atk.Results {
		for _, k := range []string{"read_mem", "write_mem", "environ"} {
			if r[k] != "PermissionError" {
				t.Errorf("template %s: %s = %s, want PermissionError", pid, k, r[k])
			}
		}
		for _, k := range []string{"attach", "seize"} {
			if r[k] == "ok" {
				t.Errorf("template %s: %s succeeded", pid, k)
			}
		}
		if r["state_after"] != "t" {
			t.Errorf("template %s is %q after the signals, want still stopped (t)", pid, r["state_after"])
		}
	}
	t.Logf("attacks: %v", atk.Results)

	// The copies do not get the signals sent to the templates (SIGTERM, SIGINT, SIGSEGV
	// would end the REPL) and start from the checkpoint's memory.
	for _, ck := range []struct {
		id, want string
	}{{ck2.ID, "8"}, {ck2.ID, "8"}} {
		var rb api.RollbackResult
		d.cliJSON(&rb, "rollback", id, "--to", ck.id, "--force")
		if rb.ProcessesRestored != 2 || len(rb.ProcessesLost) != 0 {
			t.Fatalf("rollback to %s: %+v", ck.id, rb)
		}
		if got := py.ask("secret"); got != ck.want {
			t.Errorf("after rollback to %s: secret = %s, want %s", ck.id, got, ck.want)
		}
	}

	// SIGKILL from inside destroys one template, checkpoint 2's stopped sleep (and its
	// spare: the two newest stopped sleeps, once the spares after the last rollback are
	// made): the rollback to checkpoint 2 says so and restores the rest; checkpoint 1 is
	// untouched.
	stoppedSleeps := `for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = sleep ] && [ "$(sed 's/.*) //' $p/stat | cut -c1)" = t ] && echo ${p#/proc/}; done | sort -n`
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the spare of checkpoint 2's sleep", func() bool {
		return len(strings.Fields(d.cli("exec", id, "--", "sh", "-c", stoppedSleeps))) == 3
	})
	d.cli("exec", id, "--", "sh", "-c", stoppedSleeps+` | tail -2 | xargs sh -c 'kill -9 "$@"' sh`)
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", id, "--to", ck2.ID, "--force")
	if rb.ProcessesRestored != 1 || len(rb.ProcessesLost) != 1 || rb.ProcessesLost[0].Comm != "sleep" || !strings.Contains(rb.ProcessesLost[0].Reason, "killed") {
		t.Errorf("rollback to %s after its sleep's template was killed: %+v", ck2.ID, rb)
	}
	if got := py.ask("secret"); got != "8" {
		t.Errorf("secret = %s after rollback to %s, want 8", got, ck2.ID)
	}
	rb = api.RollbackResult{}
	d.cliJSON(&rb, "rollback", id, "--to", ck1.ID, "--force")
	if rb.ProcessesRestored != 2 || len(rb.ProcessesLost) != 0 {
		t.Errorf("rollback to %s: %+v", ck1.ID, rb)
	}
	if n, all := d.psCount(id, "sleep 997"); n != 1 {
		t.Errorf("%d running sleeps after the rollback to %s, want 1: %s", n, ck1.ID, all)
	}
	// Release with templates alive: nothing stays behind.
	d.cli("release", id)
}

// TestProcessTemplatesDaemonKill (in a pool whose checkpoints keep processes by default)
// kills the daemon with templates alive: the kernel kills
// them with it (PTRACE_O_EXITKILL), so after the restart no stopped process is left in the
// sandbox, the sandbox runs, the checkpoint says its templates are gone, and a rollback to
// it restores the files, leaves the processes running as they are and lists them as lost.
func TestProcessTemplatesDaemonKill(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1, "--checkpoint-processes") // the default of checkpoint create
	id := d.lease("py").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /work && cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
	py := startPiped(d, id, "py", "python3 /repl.py")
	py.ask("v = 1")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id) // processes: the pool's default
	if len(ck.Processes) != 1 || ck.Processes[0].Kept != api.KeptTemplate {
		t.Fatalf("checkpoint processes: %+v", ck.Processes)
	}
	py.ask("v = 2")
	d.cli("exec", id, "--", "sh", "-c", "echo after > /work/f")
	stopped := `for p in /proc/[0-9]*; do [ "$(sed 's/.*) //' $p/stat 2>/dev/null | cut -c1)" = t ] && echo ${p#/proc/}; done; true`
	if out := d.cli("exec", id, "--", "sh", "-c", stopped); strings.TrimSpace(out) == "" {
		t.Fatal("no template before the kill")
	}
	d.kill()
	d.start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := strings.TrimSpace(d.cli("exec", id, "--", "sh", "-c", stopped))
		if out == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stopped processes left after the daemon's restart: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := py.ask("v"); got != "2" {
		t.Fatalf("the REPL after the restart: v = %s, want 2 (it runs on)", got)
	}
	var insp api.Checkpoint
	d.cliJSON(&insp, "checkpoint", "inspect", id, ck.ID)
	if len(insp.Processes) != 1 || insp.Processes[0].Kept != api.KeptNone || !strings.Contains(insp.Processes[0].Reason, "gone") {
		t.Errorf("checkpoint after the restart: %+v", insp.Processes)
	}
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", id, "--to", ck.ID)
	if rb.ProcessesRestored != 0 || len(rb.ProcessesLost) != 1 || rb.ProcessesStopped != 0 {
		t.Errorf("rollback after the restart: %+v", rb)
	}
	if got := py.ask("v"); got != "2" {
		t.Errorf("the REPL after the rollback: v = %s, want 2 (left running as it is)", got)
	}
	if out := d.cli("exec", id, "--", "sh", "-c", "cat /work/f 2>/dev/null || echo none"); strings.TrimSpace(out) != "none" {
		t.Errorf("file after the rollback: %q", out)
	}
	// A new checkpoint with processes works after the restart (asynchronous: the rollback
	// right after it waits for it to be durable).
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes", "--async")
	py.ask("v = 3")
	rb = api.RollbackResult{}
	d.cliJSON(&rb, "rollback", id, "--to", ck.ID)
	if got := py.ask("v"); rb.ProcessesRestored != 1 || got != "2" {
		t.Errorf("rollback to a checkpoint taken after the restart: %+v, v = %s", rb, got)
	}
}

// replSandbox starts a daemon with config and leases a Python sandbox running the REPL
// driven through pipes.
func replSandbox(t *testing.T, config string) (*daemon, string, pipeShell) {
	t.Helper()
	d := startDaemonWith(t, config)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
	return d, id, startPiped(d, id, "py", "python3 /repl.py")
}

// TestProcessTemplatesMemoryBound runs a sandbox with a per-sandbox template bound of 8 MiB:
// each step rewrites 5 MiB of a REPL's heap, so the templates of older checkpoints go, the
// newest always stays, ls shows which, a rollback to a dropped one says why, and the metrics
// count what is left.
func TestProcessTemplatesMemoryBound(t *testing.T) {
	d, id, py := replSandbox(t, "[checkpoints]\ntemplate_memory_sandbox = \"8m\"\n")
	py.ask("import os; heap = bytearray(os.urandom(20 << 20))")
	var cks []api.Checkpoint
	for i := 0; i < 4; i++ {
		py.ask(fmt.Sprintf("heap[%d:%d] = os.urandom(5 << 20); step = %d", i*(5<<20), (i+1)*(5<<20), i))
		var ck api.Checkpoint
		d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
		cks = append(cks, ck)
	}
	py.ask("heap[:] = os.urandom(20 << 20)") // every template now holds the whole heap alone
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
	var ls []api.Checkpoint
	d.cliJSON(&ls, "checkpoint", "ls", id)
	kept := map[string]string{}
	var total int64
	for _, c := range ls {
		if len(c.Processes) == 1 {
			kept[c.ID] = c.Processes[0].Kept + " " + c.Processes[0].Reason
			total += c.TemplateBytes
		}
	}
	t.Logf("templates: %v, %d bytes", kept, total)
	if !strings.HasPrefix(kept[ck.ID], api.KeptTemplate) {
		t.Errorf("the newest checkpoint lost its template: %v", kept)
	}
	if !strings.Contains(kept[cks[0].ID], "template_memory_sandbox") {
		t.Errorf("the oldest checkpoint kept its template past the bound: %v", kept)
	}
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", id, "--to", cks[0].ID)
	if rb.ProcessesRestored != 0 || len(rb.ProcessesLost) != 1 || !strings.Contains(rb.ProcessesLost[0].Reason, "template_memory_sandbox") {
		t.Errorf("rollback to a checkpoint whose template was dropped: %+v", rb)
	}
	rb = api.RollbackResult{}
	d.cliJSON(&rb, "rollback", id, "--to", ck.ID)
	if got := py.ask("step"); rb.ProcessesRestored != 1 || got != "3" {
		t.Errorf("rollback to the newest: %+v, step = %s", rb, got)
	}
}

// TestProcessTemplatesCountBound runs a sandbox with template_checkpoints = 2: of three
// checkpoints with processes, the one used least recently loses its templates (not the
// oldest: the first was rolled back to since), ls and a rollback to it say why, and the
// other two still bring the REPL back.
func TestProcessTemplatesCountBound(t *testing.T) {
	d, id, py := replSandbox(t, "[checkpoints]\ntemplate_checkpoints = 2\n")
	take := func(v int) api.Checkpoint {
		py.ask(fmt.Sprintf("v = %d", v))
		var ck api.Checkpoint
		d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
		return ck
	}
	rollback := func(to string) api.RollbackResult {
		var rb api.RollbackResult
		d.cliJSON(&rb, "rollback", id, "--to", to)
		return rb
	}
	first, second := take(1), take(2)
	if rb := rollback(first.ID); rb.ProcessesRestored != 1 || py.ask("v") != "1" {
		t.Fatalf("rollback to the first checkpoint: %+v", rb)
	}
	third := take(3)
	var ls []api.Checkpoint
	d.cliJSON(&ls, "checkpoint", "ls", id)
	kept := map[string]string{}
	for _, c := range ls {
		if len(c.Processes) == 1 {
			kept[c.ID] = c.Processes[0].Kept + " " + c.Processes[0].Reason
		}
	}
	t.Logf("kept: %v", kept)
	for _, c := range []api.Checkpoint{first, third} {
		if !strings.HasPrefix(kept[c.ID], api.KeptTemplate) {
			t.Errorf("checkpoint %s lost its template: %v", c.ID, kept)
		}
	}
	if !strings.Contains(kept[second.ID], "template_checkpoints") {
		t.Errorf("the checkpoint used least recently kept its template past the bound: %v", kept)
	}
	if rb := rollback(second.ID); rb.ProcessesRestored != 0 || len(rb.ProcessesLost) != 1 || !strings.Contains(rb.ProcessesLost[0].Reason, "template_checkpoints") {
		t.Errorf("rollback to a checkpoint whose template was dropped: %+v", rb)
	}
	for _, c := range []struct {
		ck   api.Checkpoint
		want string
	}{{first, "1"}, {third, "3"}} {
		if rb := rollback(c.ck.ID); rb.ProcessesRestored != 1 || py.ask("v") != c.want {
			t.Errorf("rollback to %s: %+v, v = %s, want %s", c.ck.ID, rb, py.ask("v"), c.want)
		}
	}
}

// TestProcessCheckpointFallsBackToCRIU: a checkpoint with processes of a sandbox running a
// multi-threaded process (a Python REPL with a running thread), which a template cannot copy,
// is taken by CRIU instead (l3, every process kept "criu", the reason naming the process);
// a rollback restores the REPL's objects and its thread, twice. The sandbox runs in a user
// namespace (the pool's default).
func TestProcessCheckpointFallsBackToCRIU(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py3", pythonImage, 1)
	id := d.lease("py3").ID
	d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
	py := startPiped(d, id, "py", "python3 /repl.py")
	py.ask("import threading, time; ticks = [0]")
	py.ask("t = threading.Thread(target=lambda: [ticks.__setitem__(0, ticks[0] + 1) or time.sleep(0.01) for _ in iter(int, 1)], daemon=True); t.start()")
	py.ask("x = 1")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
	if ck.Level != api.LevelL3 || len(ck.Processes) != 1 || ck.Processes[0].Kept != api.KeptCRIU || !strings.Contains(ck.Processes[0].Reason, "threads") {
		t.Fatalf("checkpoint of a sandbox with a multi-threaded process: level %s, %+v", ck.Level, ck.Processes)
	}
	for round := 1; round <= 2; round++ {
		py.ask("x = 2; y = 3")
		var rb api.RollbackResult
		d.cliJSON(&rb, "rollback", id, "--to", ck.ID)
		if rb.ProcessesRestored != 1 {
			t.Errorf("round %d: %+v", round, rb)
		}
		if got := py.ask("(x, 'y' in globals(), t.is_alive(), threading.active_count())"); got != "(1, False, True, 2)" {
			t.Errorf("round %d: REPL after the CRIU rollback says %s, want (1, False, True, 2)", round, got)
		}
		before := py.ask("ticks[0]")
		time.Sleep(100 * time.Millisecond)
		if after := py.ask("ticks[0]"); after == before {
			t.Errorf("round %d: the REPL's thread does not run after the rollback (ticks %s)", round, after)
		}
	}

}

// TestProcessCheckpointRecordAsMade: a checkpoint with processes is recorded once its
// templates are made, and says how each process is kept as made, not as the cut predicted.
// A template that fails (checkpoint/template=error) is told in the answer and in checkpoint
// inspect, with the reason; with the daemon killed once the record is durable
// (checkpoint/committed=exit), the checkpoint is there after the restart, its record still
// telling that failure (not a template the restart lost), and its files restorable. A
// template held back (checkpoint/template=sleep) holds the record back too.
func TestProcessCheckpointRecordAsMade(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "echo one > /root/v")
	d.cli("exec", "-d", id, "--", "sleep", "1000")

	d.restartWith("checkpoint/template=error")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
	if len(ck.Processes) != 1 || ck.Processes[0].Kept != api.KeptNone || !strings.Contains(ck.Processes[0].Reason, "injected failure") {
		t.Fatalf("checkpoint whose template failed: processes %+v, want one kept as none with the failpoint's reason", ck.Processes)
	}
	var in api.Checkpoint
	d.cliJSON(&in, "checkpoint", "inspect", id, ck.ID)
	if len(in.Processes) != 1 || in.Processes[0].Kept != api.KeptNone || in.Processes[0].Reason != ck.Processes[0].Reason {
		t.Fatalf("inspect after a failed template: %+v, want what the answer said (%+v)", in.Processes, ck.Processes)
	}

	before := d.checkpointIDs(id)
	d.restartWith("checkpoint/template=error,checkpoint/committed=exit")
	if out, _, code := d.cliRaw("checkpoint", "create", id, "--processes"); code == 0 {
		t.Fatalf("checkpoint succeeded with the daemon set to die once it is durable: %s", out)
	}
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not die at checkpoint/committed")
	}
	d.cmd = nil
	d.restartWith("")
	after := d.checkpointIDs(id)
	if len(after) != len(before)+1 {
		t.Fatalf("checkpoints %v before, %v after the crash: want the durable one kept", before, after)
	}
	d.cliJSON(&in, "checkpoint", "inspect", id, after[len(after)-1])
	if len(in.Processes) != 1 || in.Processes[0].Kept != api.KeptNone || !strings.Contains(in.Processes[0].Reason, "injected failure") {
		t.Fatalf("checkpoint recorded after its failed template, after a restart: processes %+v, want none with the template's failure", in.Processes)
	}
	d.cli("exec", id, "--", "sh", "-c", "echo two > /root/v")
	d.cli("rollback", id, "--to", after[len(after)-1])
	if out := d.cli("exec", id, "--", "cat", "/root/v"); out != "one\n" {
		t.Fatalf("files after rollback to the checkpoint: %q", out)
	}

	d.restartWith("checkpoint/template=sleep(1500)")
	start := time.Now()
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
	if took := time.Since(start); took < 1500*time.Millisecond || ck.TotalMS < 1500 || ck.FrozenMS < 1500 {
		t.Fatalf("checkpoint with its template held 1.5 s: answered after %v, total_ms %.1f, frozen_ms %.1f: want all past the template", took, ck.TotalMS, ck.FrozenMS)
	}
	d.cliJSON(&in, "checkpoint", "inspect", id, ck.ID)
	if in.FrozenMS != ck.FrozenMS {
		t.Fatalf("inspect's frozen_ms %.3f, the answer's %.3f: the record keeps the window to the last resume", in.FrozenMS, ck.FrozenMS)
	}
}

// replHugeKB reads the AnonHugePages (kB) of the sandbox's running (not templated: stopped)
// python3 /repl.py process.
func (d *daemon) replHugeKB(id string) int {
	d.t.Helper()
	out := d.cli("exec", id, "--", "sh", "-c", `for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' <$p/cmdline 2>/dev/null); st=$(sed 's/.*) //' $p/stat 2>/dev/null | cut -c1)
  [ "$c" = "python3 /repl.py " ] && [ "$st" != t ] && awk '/AnonHugePages/ {print $2}' $p/smaps_rollup
done; true`)
	kb, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		d.t.Fatalf("AnonHugePages of the REPL: %q", out)
	}
	return kb
}

// TestProcessCheckpointHugePages: before its first template, the dense heap of a process is
// collapsed into huge pages (checkpoints.huge_pages_budget), its contents unchanged; the
// copies a rollback starts share them; and a budget of "0" leaves memory as it is.
func TestProcessCheckpointHugePages(t *testing.T) {
	for _, tc := range []struct {
		config string
		huge   bool
	}{{"", true}, {"[checkpoints]\nhuge_pages_budget = \"0\"\n", false}} {
		d := startDaemonWith(t, tc.config)
		d.createPool("py", pythonImage, 1)
		id := d.lease("py").ID
		d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
		py := startPiped(d, id, "py", "python3 /repl.py")
		py.ask("import os, hashlib; heap = bytearray(os.urandom(40 << 20)); h = hashlib.sha256(heap).hexdigest()")
		if kb := d.replHugeKB(id); kb != 0 {
			t.Fatalf("the REPL maps %d kB of huge pages before any checkpoint (THP set to always on this node?)", kb)
		}
		var ck api.Checkpoint
		d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
		kb := d.replHugeKB(id)
		t.Logf("config %q: checkpoint total %.2f ms (frozen %.2f): the REPL maps %d kB of huge pages", tc.config, ck.TotalMS, ck.FrozenMS, kb)
		if tc.huge && kb < 30<<10 || !tc.huge && kb != 0 {
			t.Fatalf("config %q: the REPL maps %d kB of huge pages after its first checkpoint with processes (want huge: %v)", tc.config, kb, tc.huge)
		}
		py.ask("heap[0] ^= 1; n = 1")
		var rb api.RollbackResult
		d.cliJSON(&rb, "rollback", id, "--to", ck.ID)
		if rb.ProcessesRestored != 1 {
			t.Fatalf("rollback: %+v", rb)
		}
		if got := py.ask("hashlib.sha256(heap).hexdigest() == h"); got != "True" {
			t.Fatalf("config %q: the REPL's heap after the rollback is not the checkpoint's: %s", tc.config, got)
		}
		if kb := d.replHugeKB(id); tc.huge && kb < 30<<10 {
			t.Fatalf("the copy maps %d kB of huge pages, want its template's", kb)
		}
		d.cli("release", id)
	}
}

// TestProcessRollbackFailsWithCopiesArmed: a rollback to a checkpoint with processes that
// fails in its frozen window after the copies of its templates were armed and moved into the
// sandbox (failpoint rollback/after-files, once) leaves no copy behind: none of them runs,
// before or after the thaw, so nothing of the sandbox can reach a copy that was never
// started; the rollback is pending, and the next one finishes it with exactly one REPL back
// as at the checkpoint.
func TestProcessRollbackFailsWithCopiesArmed(t *testing.T) {
	d := startDaemonWith(t, "")
	d.restartWith("rollback/after-files=1*error") // from the start: a restart would drop templates
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
	py := startPiped(d, id, "py", "python3 /repl.py")
	py.ask("before = 1")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--processes")
	// The spare copies are forked after the checkpoint's answer; the next operation waits
	// for them (the session lock), so this list of checkpoints comes after them.
	d.cli("checkpoint", "ls", id)
	py.ask("after = 2")
	_, errOut, code := d.cliRaw("rollback", id, "--to", ck.ID)
	if code == 0 || !strings.Contains(errOut, "pending") {
		t.Fatalf("rollback with the failpoint: exit %d, %q; want an error saying it is pending", code, errOut)
	}
	for i := 0; i < 5; i++ { // the killed copies die with the thaw: none may ever run
		n, all := d.psCount(id, "python3 /repl.py")
		if n != 0 {
			t.Fatalf("after the failed rollback %d REPL processes run (want 0: the originals killed, the armed copies never started):%s", n, all)
		}
		if i == 4 && strings.Count(all, ":t:python3 /repl.py ;") != 1 { // the template alone is left, stopped
			t.Fatalf("after the failed rollback the stopped REPL processes are not the template alone (an armed copy left behind?):%s", all)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", id, "--to", ck.ID) // finishes the pending one, then rolls back again
	if rb.ProcessesRestored != 1 || len(rb.ProcessesLost) != 0 {
		t.Fatalf("rollback after the failed one: %+v", rb)
	}
	if n, all := d.psCount(id, "python3 /repl.py"); n != 1 {
		t.Fatalf("%d REPL processes run after the rollback, want 1:%s", n, all)
	}
	if got, gone := py.ask("before"), py.ask("after"); got != "1" || gone != "'NameError'" {
		t.Fatalf("REPL after the rollback: before = %s, after = %s; want 1 and NameError", got, gone)
	}
}

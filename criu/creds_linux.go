//go:build linux

package criu

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Fields of creds_entry that CRIU 4.x writes and go-criu v7's protos do not know yet.
const (
	credsNoNewPrivs = 18
	credsCapAmb     = 19
)

// maxCoreImage bounds one core-*.img read for the credentials check.
const maxCoreImage = 4 << 20

// Numbers of the capabilities the uid/gid and OOM rules depend on.
const (
	capSetGID      = 6
	capSetUID      = 7
	capSysResource = 24
)

// threadCreds is what a thread's core image says about its privileges.
type threadCreds struct {
	tid, comm   string
	uids, gids  []uint32
	groups      []uint32
	sets        map[string][]uint32 // effective, permitted, bounding, inheritable, ambient
	noNewPrivs  *bool
	seccomp     criucore.SeccompMode
	oomScoreAdj *int32
	hasCreds    bool
	leader      bool // the thread-group leader (its core image has the task core)
	zombie      bool // a zombie's core: the task core only, task_state TASK_DEAD
}

// taskDead is CRIU's task_state of a zombie (COMPEL_TASK_DEAD): dump_one_zombie writes its
// core with the task core only (comm, state, exit code), no thread core and so no
// credentials, and the restore recreates it as a process that exits at once with that code:
// none of its code runs.
const taskDead = 2

// CheckCreds refuses CRIU images whose processes would hold more privilege than spec grants
// the container: a capability (effective, permitted, bounding, inheritable or ambient) of any
// thread outside the spec's bounding set, a uid or gid other than the spec's user without
// CAP_SETUID / CAP_SETGID, no_new_privs off where the spec sets it, a process (thread-group
// leader) without seccomp where the spec has a filter, or a lower OOM score without
// CAP_SYS_RESOURCE. CRIU restores credentials from the images as they are, so a
// forged image could otherwise give a sandbox process host root's capabilities. Errors are
// errdefs.ErrPermissionDenied and name the process and what it would gain.
func CheckCreds(dir string, spec *specs.Spec) error {
	names, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("criu images in %s hold no core-*.img: %w", dir, errdefs.ErrInvalidArgument)
	}
	for _, n := range names {
		tc, err := readCoreCreds(n)
		if err != nil {
			return err
		}
		if err := tc.check(spec); err != nil {
			return err
		}
	}
	return nil
}

// readCoreCreds decodes the one CoreEntry of a core image (size-checked framing, then
// go-criu's protos).
func readCoreCreds(path string) (threadCreds, error) {
	tid := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "core-"), ".img")
	tc := threadCreds{tid: tid}
	payload, err := coreEntry(path)
	if err != nil {
		return tc, err
	}
	var core criucore.CoreEntry
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(payload, &core); err != nil {
		return tc, fmt.Errorf("criu image %s: %v: %w", filepath.Base(path), err, errdefs.ErrInvalidArgument)
	}
	th := core.GetThreadCore()
	tc.comm = th.GetComm()
	if t := core.GetTc(); t != nil {
		tc.leader, tc.comm = true, t.GetComm()
		tc.zombie = th == nil && t.GetTaskState() == taskDead
		if t.OomScoreAdj != nil {
			v := t.GetOomScoreAdj()
			tc.oomScoreAdj = &v
		}
	}
	tc.seccomp = th.GetSeccompMode()
	c := th.GetCreds()
	if c == nil {
		return tc, nil
	}
	tc.hasCreds = true
	tc.uids = []uint32{c.GetUid(), c.GetEuid(), c.GetSuid(), c.GetFsuid()}
	tc.gids = []uint32{c.GetGid(), c.GetEgid(), c.GetSgid(), c.GetFsgid()}
	tc.groups = c.GetGroups()
	tc.sets = map[string][]uint32{"effective": c.GetCapEff(), "permitted": c.GetCapPrm(),
		"bounding": c.GetCapBnd(), "inheritable": c.GetCapInh()}
	return tc, tc.unknownCreds(c.ProtoReflect().GetUnknown())
}

// coreEntry returns the payload of the single entry of a core image: magic IMG_COMMON, magic
// CORE, then a little-endian uint32 size and that many bytes.
func coreEntry(path string) ([]byte, error) {
	entry, _, err := imageEntry(path, "CORE", maxCoreImage)
	return entry, err
}

// imageEntry reads a CRIU image of the given magic name (at most max bytes): the common
// magic, the image's own, then its first entry (a 32-bit little-endian size and the
// protobuf), which it returns with whatever follows it. A file that is not such an image is
// ErrInvalidArgument naming why.
func imageEntry(path, kind string, max int) (entry, rest []byte, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, nil, err
	}
	bad := func(why string) error {
		return fmt.Errorf("criu image %s: %s: %w", filepath.Base(path), why, errdefs.ErrInvalidArgument)
	}
	if len(data) > max {
		return nil, nil, bad(fmt.Sprintf("over %d KiB", max>>10))
	}
	m := magic.LoadMagic()
	if len(data) < 12 || uint64(binary.LittleEndian.Uint32(data)) != m.ByName["IMG_COMMON"] ||
		uint64(binary.LittleEndian.Uint32(data[4:])) != m.ByName[kind] {
		return nil, nil, bad("not a CRIU " + strings.ToLower(kind) + " image")
	}
	size := int(binary.LittleEndian.Uint32(data[8:]))
	if size > len(data)-12 {
		return nil, nil, bad("entry runs past the end of the file")
	}
	return data[12 : 12+size], data[12+size:], nil
}

// unknownCreds reads the creds fields CRIU writes beyond go-criu's protos (no_new_privs,
// ambient capabilities; the latter packed or not).
func (tc *threadCreds) unknownCreds(b []byte) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("criu core image of %s: bad creds field: %w", tc.tid, errdefs.ErrInvalidArgument)
		}
		b = b[n:]
		switch {
		case num == credsNoNewPrivs && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			nnp := v != 0
			tc.noNewPrivs, n = &nnp, m
		case num == credsCapAmb && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			tc.sets["ambient"], n = append(tc.sets["ambient"], uint32(v)), m
		case num == credsCapAmb && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			for len(v) > 0 && m >= 0 {
				w, k := protowire.ConsumeVarint(v)
				if k < 0 {
					m = k
					break
				}
				tc.sets["ambient"], v = append(tc.sets["ambient"], uint32(w)), v[k:]
			}
			n = m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("criu core image of %s: bad creds field %d: %w", tc.tid, num, errdefs.ErrInvalidArgument)
		}
		b = b[n:]
	}
	return nil
}

func (tc threadCreds) String() string { return fmt.Sprintf("process %q (pid %s)", tc.comm, tc.tid) }

func (tc threadCreds) check(spec *specs.Spec) error {
	if tc.zombie { // runs nothing (taskDead); it was refused as "no credentials"
		return nil
	}
	if !tc.hasCreds {
		return fmt.Errorf("criu images: %s has no credentials in its core image: %w", tc, errdefs.ErrPermissionDenied)
	}
	p := spec.Process
	if p == nil {
		p = &specs.Process{}
	}
	allowed := map[string]bool{}
	if p.Capabilities != nil {
		for _, c := range p.Capabilities.Bounding {
			allowed[c] = true
		}
	}
	for _, set := range []string{"effective", "permitted", "bounding", "inheritable", "ambient"} {
		if extra := capsOutside(tc.sets[set], allowed); len(extra) > 0 {
			return fmt.Errorf("criu images: %s would hold %s in its %s capabilities, which the sandbox's spec does not grant: %w",
				tc, strings.Join(extra, ", "), set, errdefs.ErrPermissionDenied)
		}
	}
	if err := tc.checkIDs(p, allowed); err != nil {
		return err
	}
	return tc.checkConfinement(spec, allowed)
}

// capsOutside names the capabilities of a CRIU capability set (32-bit words, low first)
// that are not in allowed.
func capsOutside(words []uint32, allowed map[string]bool) []string {
	var out []string
	for i, w := range words {
		for bit := range 32 {
			if w&(1<<bit) == 0 {
				continue
			}
			num := i*32 + bit
			name := cap.FromNumber(num)
			if name == "" {
				name = "capability " + strconv.Itoa(num)
			}
			if !allowed[name] {
				out = append(out, name)
			}
		}
	}
	return out
}

func (tc threadCreds) checkIDs(p *specs.Process, allowed map[string]bool) error {
	if !allowed[cap.FromNumber(capSetUID)] {
		for _, u := range tc.uids {
			if u != p.User.UID {
				return fmt.Errorf("criu images: %s would run as uid %d; the sandbox's spec gives uid %d and no CAP_SETUID: %w",
					tc, u, p.User.UID, errdefs.ErrPermissionDenied)
			}
		}
	}
	if !allowed[cap.FromNumber(capSetGID)] {
		ok := append([]uint32{p.User.GID}, p.User.AdditionalGids...)
		for _, g := range append(slices.Clone(tc.gids), tc.groups...) {
			if !slices.Contains(ok, g) {
				return fmt.Errorf("criu images: %s would hold gid %d; the sandbox's spec gives %v and no CAP_SETGID: %w",
					tc, g, ok, errdefs.ErrPermissionDenied)
			}
		}
	}
	return nil
}

func (tc threadCreds) checkConfinement(spec *specs.Spec, allowed map[string]bool) error {
	p := spec.Process
	if p != nil && p.NoNewPrivileges && tc.noNewPrivs != nil && !*tc.noNewPrivs {
		return fmt.Errorf("criu images: %s has no_new_privs off; the sandbox's spec sets it: %w", tc, errdefs.ErrPermissionDenied)
	}
	// CRIU records the seccomp mode of thread-group leaders only (other threads' core images
	// carry none, whatever the kernel says), so the mode is checked on leaders.
	if tc.leader && spec.Linux != nil && spec.Linux.Seccomp != nil && tc.seccomp == criucore.SeccompMode_disabled {
		return fmt.Errorf("criu images: %s has seccomp off; the sandbox's spec requires a seccomp filter: %w", tc, errdefs.ErrPermissionDenied)
	}
	if tc.oomScoreAdj != nil && !allowed[cap.FromNumber(capSysResource)] {
		floor := 0
		if p != nil && p.OOMScoreAdj != nil {
			floor = *p.OOMScoreAdj
		}
		if int(*tc.oomScoreAdj) < floor {
			return fmt.Errorf("criu images: %s has oom_score_adj %d, below the spec's %d, without CAP_SYS_RESOURCE: %w",
				tc, *tc.oomScoreAdj, floor, errdefs.ErrPermissionDenied)
		}
	}
	return nil
}

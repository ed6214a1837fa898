//go:build linux

package criu

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/creds"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// sandboxCaps is Docker's default set without CAP_NET_RAW, as words of a CRIU image.
var sandboxCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
	"CAP_KILL", "CAP_AUDIT_WRITE"}

var sandboxWords = []uint32{1<<0 | 1<<1 | 1<<4 | 1<<3 | 1<<27 | 1<<6 | 1<<7 | 1<<31 | 1<<8 | 1<<10 | 1<<18 | 1<<5 | 1<<29, 0}

func sandboxSpec() *specs.Spec {
	return &specs.Spec{Process: &specs.Process{NoNewPrivileges: true,
		Capabilities: &specs.LinuxCapabilities{Bounding: sandboxCaps, Effective: sandboxCaps, Permitted: sandboxCaps}},
		Linux: &specs.Linux{Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActErrno}}}
}

// writeCore writes a core image for tid holding c (and extra raw creds fields).
func writeCore(t *testing.T, dir, tid string, c *creds.CredsEntry, mode criucore.SeccompMode, extra []byte) {
	t.Helper()
	core := &criucore.CoreEntry{Mtype: criucore.CoreEntry_X86_64.Enum(),
		Tc:         &criucore.TaskCoreEntry{Comm: proto.String("python3")},
		ThreadCore: &criucore.ThreadCoreEntry{Creds: c, SeccompMode: mode.Enum()}}
	if extra != nil {
		c.ProtoReflect().SetUnknown(extra)
	}
	writeCoreEntry(t, dir, tid, core)
}

func rootCreds() *creds.CredsEntry {
	w := func() []uint32 { return append([]uint32(nil), sandboxWords...) }
	z := uint32(0)
	return &creds.CredsEntry{Uid: &z, Gid: &z, Euid: &z, Egid: &z, Suid: &z, Sgid: &z, Fsuid: &z, Fsgid: &z,
		Secbits: &z, CapEff: w(), CapPrm: w(), CapBnd: w(), CapInh: []uint32{0, 0}}
}

func TestCheckCreds(t *testing.T) {
	nnpOn := protowire.AppendVarint(protowire.AppendTag(nil, credsNoNewPrivs, protowire.VarintType), 1)
	cases := []struct {
		name  string
		edit  func(c *creds.CredsEntry)
		mode  criucore.SeccompMode
		extra []byte
		want  string // "" = allowed
	}{
		{"as dumped", func(c *creds.CredsEntry) {}, criucore.SeccompMode_filter, nnpOn, ""},
		{"full effective caps", func(c *creds.CredsEntry) { c.CapEff = []uint32{^uint32(0), 0x1ff} }, criucore.SeccompMode_filter, nnpOn, "CAP_SYS_ADMIN"},
		{"bounding set raised", func(c *creds.CredsEntry) { c.CapBnd[0] |= 1 << 12 }, criucore.SeccompMode_filter, nnpOn, "CAP_NET_ADMIN in its bounding"},
		{"raw sockets", func(c *creds.CredsEntry) { c.CapPrm[0] |= 1 << 13 }, criucore.SeccompMode_filter, nnpOn, "CAP_NET_RAW"},
		{"ambient caps", func(c *creds.CredsEntry) {}, criucore.SeccompMode_filter,
			protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), nnpOn...), credsCapAmb, protowire.VarintType), 1<<21), "CAP_SYS_ADMIN in its ambient"},
		{"seccomp off", func(c *creds.CredsEntry) {}, criucore.SeccompMode_disabled, nnpOn, "seccomp off"},
		{"no_new_privs off", func(c *creds.CredsEntry) {}, criucore.SeccompMode_filter,
			protowire.AppendVarint(protowire.AppendTag(nil, credsNoNewPrivs, protowire.VarintType), 0), "no_new_privs off"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := rootCreds()
			tc.edit(c)
			writeCore(t, dir, "42", c, tc.mode, tc.extra)
			err := CheckCreds(dir, sandboxSpec())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("want allowed, got %v", err)
				}
				return
			}
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"python3" (pid 42)`) {
				t.Fatalf("want permission denied naming python3 and %q, got %v", tc.want, err)
			}
		})
	}
}

func TestCheckCredsIDsWithoutSetuid(t *testing.T) {
	dir := t.TempDir()
	c := rootCreds()
	c.CapEff, c.CapPrm, c.CapBnd = []uint32{1, 0}, []uint32{1, 0}, []uint32{1, 0} // CAP_CHOWN only
	writeCore(t, dir, "7", c, criucore.SeccompMode_filter, nil)
	spec := sandboxSpec()
	spec.Process.User.UID = 1000
	spec.Process.Capabilities.Bounding = []string{"CAP_CHOWN"}
	if err := CheckCreds(dir, spec); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "uid 0") {
		t.Fatalf("uid 0 for a uid 1000 sandbox without CAP_SETUID: got %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "core-7.img"), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckCreds(dir, sandboxSpec()); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a malformed core image: want invalid argument, got %v", err)
	}
}

// writeCoreEntry writes core as tid's core image.
func writeCoreEntry(t *testing.T, dir, tid string, core *criucore.CoreEntry) {
	t.Helper()
	payload, err := (proto.MarshalOptions{AllowPartial: true}).Marshal(core)
	if err != nil {
		t.Fatal(err)
	}
	m := magic.LoadMagic()
	b := binary.LittleEndian.AppendUint32(nil, uint32(m.ByName["IMG_COMMON"]))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.ByName["CORE"]))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	if err := os.WriteFile(filepath.Join(dir, "core-"+tid+".img"), append(b, payload...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestCheckCredsZombie: a zombie's core, as CRIU writes it (task core only, TASK_DEAD), passes
// the check (a dump that caught a child not yet reaped failed its restore with "has no
// credentials"); a live process's core without credentials, or one that claims TASK_DEAD but
// carries a thread core, is still refused.
func TestCheckCredsZombie(t *testing.T) {
	zombie := func() *criucore.CoreEntry {
		return &criucore.CoreEntry{Mtype: criucore.CoreEntry_X86_64.Enum(),
			Tc: &criucore.TaskCoreEntry{Comm: proto.String("sh"), TaskState: proto.Uint32(taskDead), ExitCode: proto.Uint32(0)}}
	}
	dir := t.TempDir()
	writeCore(t, dir, "42", rootCreds(), criucore.SeccompMode_filter,
		protowire.AppendVarint(protowire.AppendTag(nil, credsNoNewPrivs, protowire.VarintType), 1))
	writeCoreEntry(t, dir, "34", zombie())
	if err := CheckCreds(dir, sandboxSpec()); err != nil {
		t.Fatalf("a zombie's core was refused: %v", err)
	}
	alive := zombie()
	alive.Tc.TaskState = proto.Uint32(1) // TASK_ALIVE
	writeCoreEntry(t, dir, "34", alive)
	if err := CheckCreds(dir, sandboxSpec()); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "no credentials") {
		t.Fatalf("a live process without credentials: want permission denied, got %v", err)
	}
	forged := zombie()
	forged.ThreadCore = &criucore.ThreadCoreEntry{}
	writeCoreEntry(t, dir, "34", forged)
	if err := CheckCreds(dir, sandboxSpec()); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("a TASK_DEAD core with a thread core and no credentials: want permission denied, got %v", err)
	}
}

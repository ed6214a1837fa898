package criu

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"
)

// criuNetworkLockNftables is CRIU's NETWORK_LOCK_NFTABLES (criu/include/cr_options.h).
const criuNetworkLockNftables = 1

// TestDumpLocksTheNetworkWithNftables: the CRIU that hack/ installs locks a dumped sandbox's
// network with nftables, in CRIU itself (built with NETWORK_LOCK_DEFAULT, since runc gives
// CRIU no lock option and a configuration file that names one crashes CRIU 4.1.1 in RPC
// mode), not by running iptables-restore twice per dump and restore; a restore uses the
// method its dump recorded in the inventory.
func TestDumpLocksTheNetworkWithNftables(t *testing.T) {
	e := newEnv(t)
	sb := e.newSandbox(t, busyboxImage, counterScript, Options{TCPEstablished: true})
	sb.waitCount(t, "counter to start", func(n int) bool { return n > 2 })
	images := filepath.Join(t.TempDir(), "images")
	if _, err := e.cp.Dump(e.ctx, sb.id, images); err != nil {
		t.Fatal(err)
	}
	inv := readInventory(t, filepath.Join(images, "inventory.img"))
	if inv.NetworkLockMethod == nil || inv.GetNetworkLockMethod() != criuNetworkLockNftables {
		t.Fatalf("the dump's network lock method is %d (recorded: %v), want nftables (%d): is criu on PATH built by hack/install-deps.sh?",
			inv.GetNetworkLockMethod(), inv.NetworkLockMethod != nil, criuNetworkLockNftables)
	}
	e.kill(t, sb)
	e.restore(t, sb, images)
	sb.waitCount(t, "restored counter to keep counting", func(n int) bool { return n > 0 })
}

// readInventory decodes a dump's inventory image: CRIU's magic words, then one entry.
func readInventory(t *testing.T, path string) *inventory.InventoryEntry {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := magic.LoadMagic()
	off := 0
	for off+4 <= len(data) && off < 8 {
		w := uint64(binary.LittleEndian.Uint32(data[off:]))
		if w != m.ByName["IMG_COMMON"] && w != m.ByName["IMG_SERVICE"] && w != m.ByName["INVENTORY"] {
			break
		}
		off += 4
	}
	if off == 0 || off+4 > len(data) {
		t.Fatalf("%s is not a CRIU inventory image", path)
	}
	size := int(binary.LittleEndian.Uint32(data[off:]))
	if off+4+size > len(data) {
		t.Fatalf("%s: entry runs past the end", path)
	}
	var inv inventory.InventoryEntry
	if err := proto.Unmarshal(data[off+4:off+4+size], &inv); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &inv
}

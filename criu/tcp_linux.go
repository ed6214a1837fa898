//go:build linux

package criu

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// TCP states of /proc/net/tcp that carry no connection.
const (
	tcpClose  = "07"
	tcpListen = "0A"
)

// loopbackTCPOnly reports whether every TCP connection the processes of tree have open runs
// over loopback (listening and unconnected sockets do not count). Such connections can be
// restored established under a new identity: both ends are in the sandbox and its loopback
// addresses do not change. Sockets are looked up in the network namespace of the root.
func loopbackTCPOnly(tree []proc) (bool, error) {
	if len(tree) == 0 {
		return true, nil
	}
	conns := map[string]bool{} // inode -> both ends on loopback
	for _, table := range []string{"tcp", "tcp6"} {
		if err := readTCPTable(fmt.Sprintf("/proc/%d/net/%s", tree[0].pid, table), conns); err != nil {
			return false, err
		}
	}
	for _, p := range tree {
		inodes, err := socketInodes(p.pid)
		if err != nil {
			return false, err
		}
		for ino := range inodes {
			if loop, ok := conns[ino]; ok && !loop {
				return false, nil
			}
		}
	}
	return true, nil
}

// readTCPTable adds the connected sockets of a /proc/net/tcp{,6} table to conns.
func readTCPTable(path string, conns map[string]bool) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil // no IPv6
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[0] == "sl" || f[3] == tcpListen || f[3] == tcpClose {
			continue
		}
		conns[f[9]] = procLoopback(f[1]) && procLoopback(f[2])
	}
	return sc.Err()
}

// procLoopback reports whether a /proc/net/tcp address ("0100007F:1F90") is a loopback one.
func procLoopback(addr string) bool {
	hexIP, _, _ := strings.Cut(addr, ":")
	return procIP(hexIP).IsLoopback()
}

// procIP decodes the IP of a /proc/net address: 32-bit words in host byte order
// (little-endian on the architectures DeltaBox runs on); nil when malformed.
func procIP(hexIP string) net.IP {
	b, err := hex.DecodeString(hexIP)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b)
}

// ErrInetSockets is wrapped (with errdefs.ErrFailedPrecondition) into the error of a dump
// refused because a process has a TCP or UDP socket open while CRIU cannot dump those on
// this kernel: Linux 6.16 refuses SO_PASSCRED and SO_PASSSEC on them, and CRIU before 4.2
// reads both for every socket and gives up.
var ErrInetSockets = errors.New("CRIU < 4.2 cannot dump TCP or UDP sockets on Linux >= 6.16 (SO_PASSCRED is refused on them)")

// passCredFixVersion is the first CRIU that reads SO_PASSCRED only where the kernel has it.
const passCredFixVersion = 40200

var (
	passCredOnce       sync.Once
	passCredRestricted bool
)

// InetSocketsDumpable reports whether the CRIU of the given version (go-criu encoding) can
// dump TCP and UDP sockets on this kernel. It probes the kernel once: getsockopt(SO_PASSCRED)
// on a TCP socket fails with EOPNOTSUPP from Linux 6.16 on.
func InetSocketsDumpable(criuVersion int) bool {
	if criuVersion >= passCredFixVersion {
		return true
	}
	passCredOnce.Do(func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		_, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED)
		passCredRestricted = errors.Is(err, unix.EOPNOTSUPP)
	})
	return !passCredRestricted
}

// inetTables are the /proc/<pid>/net tables of the sockets CRIU dumps as inet sockets.
var inetTables = []string{"tcp", "tcp6", "udp", "udp6", "udplite", "udplite6", "raw", "raw6"}

// checkInet refuses a tree in which a process has an inet socket open.
func checkInet(tree []proc) error {
	if len(tree) == 0 {
		return nil
	}
	socks := map[string]string{} // inode -> "tcp 127.0.0.1:7007"
	for _, table := range inetTables {
		if err := readInetTable(tree[0].pid, table, socks); err != nil {
			return err
		}
	}
	for _, p := range tree {
		inodes, err := socketInodes(p.pid)
		if err != nil {
			return err
		}
		for ino := range inodes {
			if desc, ok := socks[ino]; ok {
				return fmt.Errorf("%s has a %s socket open: %w; close it, or take an L1/L2 checkpoint: %w",
					p, desc, ErrInetSockets, errdefs.ErrFailedPrecondition)
			}
		}
	}
	return nil
}

func readInetTable(pid int, table string, socks map[string]string) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[0] == "sl" {
			continue
		}
		desc := strings.ToUpper(strings.TrimRight(table, "6")) + " " + procAddr(f[1])
		if f[3] == tcpListen && strings.HasPrefix(table, "tcp") {
			desc += " (listening)"
		}
		socks[f[9]] = desc
	}
	return sc.Err()
}

// procAddr renders a /proc/net address ("0100007F:1B5F") as "127.0.0.1:7007".
func procAddr(addr string) string {
	hexIP, hexPort, _ := strings.Cut(addr, ":")
	ip := procIP(hexIP)
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if ip == nil || err != nil {
		return addr
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}

package initd

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// identity is a resolved exec user.
type identity struct {
	uid, gid uint32
	groups   []uint32 // supplementary groups
	home     string   // empty when the user is not in passwd
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// lookupIdentity resolves "uid[:gid]" or "name[:group]" (any mix) against the passwd and
// group files in etcDir, like Docker: a numeric uid need not exist (gid then defaults to 0),
// a name must; supplementary groups are those listing the user's name.
func lookupIdentity(etcDir, spec string) (identity, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return identity{}, fmt.Errorf("user %q: want uid[:gid] or name[:group]: %w", spec, errdefs.ErrInvalidArgument)
	}
	users, err := readPasswd(filepath.Join(etcDir, "passwd"))
	if err != nil {
		return identity{}, err
	}
	groups, err := readGroup(filepath.Join(etcDir, "group"))
	if err != nil {
		return identity{}, err
	}
	id, name, err := resolveUser(users, userPart)
	if err != nil {
		return identity{}, err
	}
	if hasGroup {
		if id.gid, err = resolveGroup(groups, groupPart); err != nil {
			return identity{}, err
		}
	}
	id.groups = supplementaryGroups(groups, name)
	return id, nil
}

// resolveUser returns the identity for a uid or user name, and the user's name if known.
func resolveUser(users []passwdEntry, s string) (identity, string, error) {
	if uid, err := parseID(s); err == nil {
		for _, u := range users {
			if u.uid == uid {
				return identity{uid: u.uid, gid: u.gid, home: u.home}, u.name, nil
			}
		}
		return identity{uid: uid}, "", nil
	}
	for _, u := range users {
		if u.name == s {
			return identity{uid: u.uid, gid: u.gid, home: u.home}, u.name, nil
		}
	}
	return identity{}, "", fmt.Errorf("user %q not found in the sandbox's passwd: %w", s, errdefs.ErrNotFound)
}

func resolveGroup(groups []groupEntry, s string) (uint32, error) {
	if gid, err := parseID(s); err == nil {
		return gid, nil
	}
	for _, g := range groups {
		if g.name == s {
			return g.gid, nil
		}
	}
	return 0, fmt.Errorf("group %q not found in the sandbox's group file: %w", s, errdefs.ErrNotFound)
}

func supplementaryGroups(groups []groupEntry, user string) []uint32 {
	out := []uint32{}
	if user == "" {
		return out
	}
	for _, g := range groups {
		for _, m := range g.members {
			if m == user {
				out = append(out, g.gid)
				break
			}
		}
	}
	return out
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err
}

// readPasswd parses a passwd file; a missing file is an empty one.
func readPasswd(path string) ([]passwdEntry, error) {
	var out []passwdEntry
	err := readColonFile(path, 7, func(f []string) {
		uid, err1 := parseID(f[2])
		gid, err2 := parseID(f[3])
		if err1 == nil && err2 == nil {
			out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
		}
	})
	return out, err
}

// readGroup parses a group file; a missing file is an empty one.
func readGroup(path string) ([]groupEntry, error) {
	var out []groupEntry
	err := readColonFile(path, 4, func(f []string) {
		gid, err := parseID(f[2])
		if err != nil {
			return
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		out = append(out, groupEntry{name: f[0], gid: gid, members: members})
	})
	return out, err
}

// readColonFile calls fn with the fields of every well-formed line (at least n fields,
// not a comment) of a colon-separated file.
func readColonFile(path string, n int, fn func([]string)) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fields := strings.Split(line, ":"); len(fields) >= n {
			fn(fields)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

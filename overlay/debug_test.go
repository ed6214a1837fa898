//go:build linux

package overlay

import (
	"fmt"
	"os"
)

func debugChain(s *Store, path string) string {
	if os.Getenv("DELTABOX_OVERLAY_RANDOM_TRACE") == "" {
		return ""
	}
	out := ""
	for _, m := range s.chain {
		for _, e := range m.Entries {
			if e.Path == path {
				out += fmt.Sprintf("%s(full=%v): %s opaque=%v link=%s; ", m.ID, m.Full, e.Kind, e.Opaque, e.Link)
			}
		}
		if k, ok := m.Index[path]; ok {
			out += fmt.Sprintf("%s idx %v; ", m.ID, k)
		}
	}
	return out
}

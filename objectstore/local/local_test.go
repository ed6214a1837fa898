package local_test

import (
	"testing"

	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/objectstore/local"
	"github.com/deltabox/deltabox/objectstore/storetest"
)

func newStore(t *testing.T) objectstore.Store {
	s, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

const benchSize = 64 << 20

func BenchmarkPut(b *testing.B) {
	s, err := local.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	storetest.BenchmarkPut(b, s, benchSize)
}

func BenchmarkGet(b *testing.B) {
	s, err := local.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	storetest.BenchmarkGet(b, s, benchSize)
}

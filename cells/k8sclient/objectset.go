package k8sclient

import (
	"hash/maphash"
	"iter"
)

// objectSet holds manifests by their object's key: what a pass wants, and
// what the passes have applied, an entry per object of the directory (100,000 for 50,000
// Services, for as long as the agent runs). A map by objectKey, 40 bytes
// of key and 8 of value a slot, took about 80 bytes an entry; keyed by the
// key's 64-bit hash a slot is 16 bytes, about 25 an entry. A key whose
// hash another key already holds goes to a map by key, empty but for such
// collisions.
type objectSet struct {
	byHash   map[uint64]*manifest
	collided map[objectKey]*manifest
	// hash is objectKey.hash but in tests, which make collisions.
	hash func(objectKey) uint64
}

func newObjectSet() objectSet {
	return objectSet{byHash: map[uint64]*manifest{}, collided: map[objectKey]*manifest{}, hash: objectKey.hash}
}

// keySeed seeds the keys' hashes: they are compared only within the
// process.
var keySeed = maphash.MakeSeed()

// hash hashes the key's type by identity (types are interned: see typeOf)
// and its names by content.
func (k objectKey) hash() uint64 { return maphash.Comparable(keySeed, k) }

// get is the manifest of key, nil if there is none.
func (s objectSet) get(key objectKey) *manifest {
	if m := s.byHash[s.hash(key)]; m != nil && m.key == key {
		return m
	}
	return s.collided[key]
}

// set makes m the manifest of its key.
func (s objectSet) set(m *manifest) {
	h := s.hash(m.key)
	if cur := s.byHash[h]; cur == nil || cur.key == m.key {
		s.byHash[h] = m
		return
	}
	s.collided[m.key] = m
}

// delete forgets key's manifest.
func (s objectSet) delete(key objectKey) {
	h := s.hash(key)
	if cur := s.byHash[h]; cur == nil || cur.key != key {
		delete(s.collided, key)
		return
	}
	delete(s.byHash, h)
	// A key of the same hash waiting in collided takes the place.
	for k, m := range s.collided {
		if s.hash(k) == h {
			s.byHash[h] = m
			delete(s.collided, k)
			return
		}
	}
}

func (s objectSet) len() int { return len(s.byHash) + len(s.collided) }

// all is every manifest, in no order. Deleting as it goes could skip one
// (a delete may move a manifest from collided to byHash).
func (s objectSet) all() iter.Seq[*manifest] {
	return func(yield func(*manifest) bool) {
		for _, m := range s.byHash {
			if !yield(m) {
				return
			}
		}
		for _, m := range s.collided {
			if !yield(m) {
				return
			}
		}
	}
}

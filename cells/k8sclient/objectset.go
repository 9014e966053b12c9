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
type objectSet = hashedSet[seededHash]

func newObjectSet() objectSet { return newHashedSet[seededHash]() }

// hashedSet is objectSet over the keys' hash H: the agent's is seededHash;
// the tests give theirs, which makes collisions. H is a type, not a
// field: it takes no room and the agent has one.
type hashedSet[H keyHasher] struct {
	byHash   map[uint64]*manifest
	collided map[objectKey]*manifest
}

// keyHasher hashes keys; its zero value is ready to use.
type keyHasher interface{ hash(objectKey) uint64 }

type seededHash struct{}

func (seededHash) hash(k objectKey) uint64 { return k.hash() }

func newHashedSet[H keyHasher]() hashedSet[H] {
	return hashedSet[H]{byHash: map[uint64]*manifest{}, collided: map[objectKey]*manifest{}}
}

// keySeed seeds the keys' hashes: they are compared only within the
// process.
var keySeed = maphash.MakeSeed()

// hash hashes the key's type by identity (types are interned: see typeOf)
// and its names by content.
func (k objectKey) hash() uint64 { return maphash.Comparable(keySeed, k) }

// get is the manifest of key, nil if there is none.
func (s hashedSet[H]) get(key objectKey) *manifest {
	if m := s.byHash[hashOf[H](key)]; m != nil && m.key == key {
		return m
	}
	return s.collided[key]
}

// set makes m the manifest of its key.
func (s hashedSet[H]) set(m *manifest) {
	h := hashOf[H](m.key)
	if cur := s.byHash[h]; cur == nil || cur.key == m.key {
		s.byHash[h] = m
		return
	}
	s.collided[m.key] = m
}

// delete forgets key's manifest.
func (s hashedSet[H]) delete(key objectKey) {
	h := hashOf[H](key)
	if cur := s.byHash[h]; cur == nil || cur.key != key {
		delete(s.collided, key)
		return
	}
	delete(s.byHash, h)
	// A key of the same hash waiting in collided takes the place.
	for k, m := range s.collided {
		if hashOf[H](k) == h {
			s.byHash[h] = m
			delete(s.collided, k)
			return
		}
	}
}

// hashOf is H's hash of key.
func hashOf[H keyHasher](key objectKey) uint64 {
	var h H
	return h.hash(key)
}

func (s hashedSet[H]) len() int { return len(s.byHash) + len(s.collided) }

// all is every manifest, in no order. Deleting as it goes could skip one
// (a delete may move a manifest from collided to byHash).
func (s hashedSet[H]) all() iter.Seq[*manifest] {
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

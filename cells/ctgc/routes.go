package ctgc

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/ctmap"
)

// apiRoutes serves the conntrack maps and the GC: GET /v1/conntrack,
// POST /v1/conntrack/flush, GET and POST /v1/conntrack/gc.
func apiRoutes(gc *GC) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathConntrack, Handler: gc.listHandler},
		api.Route{Method: http.MethodPost, Path: apiv1.PathConntrackFlush, Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			flushed, err := gc.Flush()
			out := apiv1.ConntrackFlush{Maps: []apiv1.ConntrackMapFlush{}}
			for _, f := range flushed {
				out.Deleted += f.Deleted
				out.Maps = append(out.Maps, apiv1.ConntrackMapFlush{Map: f.Map, Deleted: f.Deleted})
			}
			if err != nil {
				return nil, api.Errorf(http.StatusInternalServerError, "flush deleted %d entries, then failed: %v", out.Deleted, err)
			}
			gc.log.Info("Flushed the conntrack maps", "deleted", out.Deleted)
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathConntrackGC, Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			st, _ := gc.Status()
			return statusAnswer(st), nil
		}},
		api.Route{Method: http.MethodPost, Path: apiv1.PathConntrackGC, Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			p, err := gc.Run(req.Context())
			switch {
			case p.Number == 0:
				// No pass ran: the GC is stopped or the client gave up.
				return nil, api.Errorf(http.StatusServiceUnavailable, "no garbage collection pass: %v", err)
			case err != nil:
				return nil, api.Errorf(http.StatusInternalServerError, "garbage collection pass %d failed after deleting %d entries: %v", p.Number, p.Deleted(), err)
			}
			return passAnswer(&p), nil
		}},
	)
}

// listHandler answers GET /v1/conntrack[?family=4|6][&endpoint=ID]
// [&limit=N][&after=CURSOR]. A listing cut short by limit says so and gives
// the cursor of its last entry, from which ?after continues.
func (gc *GC) listHandler(req *http.Request) (any, error) {
	q, err := api.QueryParams(req, "family", "endpoint", "limit", "after")
	if err != nil {
		return nil, err
	}
	f := listFilter{}
	if q.Has("family") {
		switch q.Get("family") {
		case "4":
			f.family = 4
		case "6":
			f.family = 6
		default:
			return nil, api.BadRequest("invalid family %q: want 4 or 6", q.Get("family"))
		}
	}
	if q.Has("endpoint") {
		id, err := strconv.ParseUint(q.Get("endpoint"), 10, 16)
		if err != nil || id == 0 {
			return nil, api.BadRequest("invalid endpoint %q: want an endpoint ID from 1 to 65535 (`agent endpoint list` shows them)", q.Get("endpoint"))
		}
		f.endpoint = uint16(id)
	}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 0 {
			return nil, api.BadRequest("invalid limit %q: want a number of entries, 0 for all", q.Get("limit"))
		}
		f.limit = n
	}
	var after cursor
	if q.Has("after") {
		if after, err = parseCursor(q.Get("after")); err != nil {
			return nil, err
		}
	}

	l := &listing{filter: f, now: ctmap.Now(), out: apiv1.ConntrackEntries{Entries: []apiv1.ConntrackEntry{}}}
	walks := []func() error{}
	if f.family != 6 {
		walks = append(walks, func() error { return list(l, gc.maps.TCP4, 4, after) }, func() error { return list(l, gc.maps.Any4, 4, after) })
	}
	if f.family != 4 {
		walks = append(walks, func() error { return list(l, gc.maps.TCP6, 6, after) }, func() error { return list(l, gc.maps.Any6, 6, after) })
	}
	names := []string{gc.maps.TCP4.Name(), gc.maps.Any4.Name(), gc.maps.TCP6.Name(), gc.maps.Any6.Name()}
	if after.mapName != "" && !slices.Contains(names, after.mapName) {
		return nil, api.BadRequest("invalid after %q: no conntrack map %s", q.Get("after"), after.mapName)
	}
	for _, walk := range walks {
		if err := walk(); err != nil {
			return nil, err
		}
		if l.out.Truncated {
			break
		}
	}
	if !l.out.Truncated {
		l.out.Next = "" // the limit fell on the last entry
	}
	return l.out, nil
}

// listFilter narrows a listing; zero fields do not narrow.
type listFilter struct {
	family   int
	endpoint uint16
	limit    int
}

// listing collects the entries of a GET /v1/conntrack.
type listing struct {
	filter listFilter
	now    uint32
	out    apiv1.ConntrackEntries
	// resumed is set once the walk passed the cursor's map: the maps
	// after it are walked whole.
	resumed bool
}

// cursor is where a listing resumes: after key (in its binary form) of
// mapName. Its text form, "<map>/<hex key>", is opaque to clients.
type cursor struct {
	mapName string
	key     []byte
}

func parseCursor(s string) (cursor, error) {
	name, hexKey, ok := strings.Cut(s, "/")
	key, err := hex.DecodeString(hexKey)
	if !ok || name == "" || err != nil {
		return cursor{}, api.BadRequest("invalid after %q: want the next cursor of an earlier listing", s)
	}
	return cursor{mapName: name, key: key}, nil
}

func cursorOf[K tuple](mapName string, k K) string {
	b, _ := binary.Append(nil, binary.NativeEndian, k)
	return mapName + "/" + hex.EncodeToString(b)
}

// tuple is what a listing shows of a key of either family.
type tuple interface {
	ctmap.Key4 | ctmap.Key6
	Src() netip.AddrPort
	Dst() netip.AddrPort
}

// list adds the entries of m that pass the filter, until the limit. Without
// a cursor it walks with batch lookups like a pass, but deletes nothing and
// holds no lock of the GC, so it never waits for a pass. In the cursor's
// map it resumes after the cursor's key, one key at a time; the maps before
// that one are skipped.
func list[K tuple](l *listing, m *bpfmaps.Map[K, ctmap.Entry], family int, after cursor) error {
	switch {
	case after.mapName == "" || l.resumed:
	case after.mapName == m.Name():
		l.resumed = true
		var key K
		if _, err := binary.Decode(after.key, binary.NativeEndian, &key); err != nil || len(after.key) != binary.Size(key) {
			return api.BadRequest("invalid after: the key is not one of %s", m.Name())
		}
		return listAfter(l, m, family, key)
	default:
		return nil // a map before the cursor's
	}
	keys, entries := make([]K, listChunkSize), make([]ctmap.Entry, listChunkSize)
	var cursor bpfmaps.BatchCursor
	for done := false; !done; {
		var (
			n   int
			err error
		)
		n, done, err = m.BatchLookup(&cursor, keys, entries)
		if err != nil {
			return err
		}
		for i := range n {
			if !add(l, m.Name(), family, keys[i], &entries[i]) {
				return nil
			}
		}
	}
	return nil
}

// listAfter walks m from the key after key. See bpfmaps.Map.NextKey for
// what happens when key is gone.
func listAfter[K tuple](l *listing, m *bpfmaps.Map[K, ctmap.Entry], family int, key K) error {
	for {
		next, ok, err := m.NextKey(key)
		if err != nil || !ok {
			return err
		}
		key = next
		e, err := m.Lookup(key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // deleted since NextKey
		}
		if err != nil {
			return err
		}
		if !add(l, m.Name(), family, key, &e) {
			return nil
		}
	}
}

// add adds an entry that passes the filter, and says whether the listing
// goes on: false once it holds limit entries and found one more.
func add[K tuple](l *listing, mapName string, family int, k K, e *ctmap.Entry) bool {
	if l.filter.endpoint != 0 && e.EndpointID != l.filter.endpoint {
		return true
	}
	if l.filter.limit > 0 && len(l.out.Entries) == l.filter.limit {
		l.out.Truncated = true
		return false
	}
	l.out.Entries = append(l.out.Entries, entryAnswer(mapName, family, k, e, l.now))
	if l.filter.limit > 0 && len(l.out.Entries) == l.filter.limit {
		l.out.Next = cursorOf(mapName, k)
	}
	return true
}

// listChunkSize is smaller than a pass's chunk: a listing allocates its
// own.
const listChunkSize = 1024

func entryAnswer[K tuple](mapName string, family int, k K, e *ctmap.Entry, now uint32) apiv1.ConntrackEntry {
	var proto, flags uint8
	switch k := any(k).(type) {
	case ctmap.Key4:
		proto, flags = k.Proto, k.Flags
	case ctmap.Key6:
		proto, flags = k.Proto, k.Flags
	}
	direction := "out"
	if flags&ctmap.KeyIncoming != 0 {
		direction = "in"
	}
	var flagNames []string
	if e.Flags != 0 {
		flagNames = strings.Split(e.FlagNames(), "|")
	}
	src, dst := k.Src(), k.Dst()
	return apiv1.ConntrackEntry{
		Map:              mapName,
		Family:           family,
		Protocol:         ctmap.ProtoName(proto),
		Direction:        direction,
		Source:           src.Addr().String(),
		SrcPort:          src.Port(),
		Destination:      dst.Addr().String(),
		DstPort:          dst.Port(),
		State:            e.State(),
		Flags:            flagNames,
		LifetimeSeconds:  int64(e.ExpiresIn(now) / time.Second),
		EndpointID:       e.EndpointID,
		PacketsTx:        e.PacketsTx,
		BytesTx:          e.BytesTx,
		PacketsRx:        e.PacketsRx,
		BytesRx:          e.BytesRx,
		LastTxSecondsAgo: secondsAgo(e.LastTx, now),
		LastRxSecondsAgo: secondsAgo(e.LastRx, now),
	}
}

// secondsAgo is how long before now a boot-time second was, -1 for 0
// (never).
func secondsAgo(t, now uint32) int64 {
	if t == 0 {
		return -1
	}
	return int64(now) - int64(t)
}

func statusAnswer(st Status) apiv1.ConntrackGC {
	out := apiv1.ConntrackGC{
		Waiting:         st.Waiting,
		Passes:          st.Passes,
		IntervalMode:    "adaptive",
		IntervalSeconds: int64(st.Interval / time.Second),
	}
	if st.Fixed {
		out.IntervalMode = "fixed"
	}
	if st.Last != nil {
		p := passAnswer(st.Last)
		out.Last = &p
	}
	return out
}

func passAnswer(p *Pass) apiv1.ConntrackGCPass {
	out := apiv1.ConntrackGCPass{
		Number:          p.Number,
		Start:           p.Start,
		DurationSeconds: p.Duration.Seconds(),
		Scanned:         p.Scanned(),
		Deleted:         p.Deleted(),
		Share:           p.Share,
		IntervalSeconds: int64(p.Interval / time.Second),
		Maps:            []apiv1.ConntrackGCMap{},
	}
	for _, m := range p.Maps {
		out.Maps = append(out.Maps, apiv1.ConntrackGCMap{
			Map: m.Map, Capacity: m.Capacity, Scanned: m.Scanned, Expired: m.Expired, EndpointGone: m.EndpointGone,
		})
	}
	if p.Err != nil {
		out.Error = p.Err.Error()
	}
	return out
}

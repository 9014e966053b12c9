package kubeclient

import "k8s.io/client-go/tools/cache"

// Paged is lw as every informer and reflector of the agent gets it: its
// listings are lists in pages (client-go's pager), never streaming lists
// (a watch with sendInitialEvents), also where the API server can stream.
// A stream's events are not gzip'd: at 20,000 Services an agent's start
// was sent 20.4 MB streamed against 2.2 MB in pages, and cost
// kube-apiserver more CPU (docs/performance.md, "Scale on a real API
// server"). A kind just created (a CRD this agent installed) is listed at
// once, where a streaming list of it is answered with Retry-After: 1 s
// until its watch cache is ready.
func Paged(lw *cache.ListWatch) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(lw, noWatchList{})
}

// noWatchList tells client-go that its client does not stream lists.
type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

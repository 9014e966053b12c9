package nodes

// RouteListings is how many times the local node's job has listed the
// default routes in this process.
func RouteListings() uint64 { return routeListings.Load() }

package loader

// NewHostVeth is newHostVeth for the external tests.
var NewHostVeth = newHostVeth

// NewVeth is newVeth for the external tests.
var NewVeth = newVeth

// NodePortPasses is how many passes the NodePort job has made (map
// writes, attaches, prune) in this process.
func NodePortPasses() uint64 { return nodePortPasses.Load() }

// NodePortSeen is the revision of the devices table that the NodePort job
// last read and acted on.
func NodePortSeen() uint64 { return nodePortSeen.Load() }

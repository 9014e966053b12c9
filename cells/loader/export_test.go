package loader

// NewHostVeth is newHostVeth for the external tests.
var NewHostVeth = newHostVeth

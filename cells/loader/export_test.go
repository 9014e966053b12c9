package loader

// NewHostVeth is newHostVeth for the external tests.
var NewHostVeth = newHostVeth

// NewVeth is newVeth for the external tests.
var NewVeth = newVeth

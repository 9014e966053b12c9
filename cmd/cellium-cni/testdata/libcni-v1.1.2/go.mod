// A runtime's CNI library as containerd 1.7 links it (libcni v1.1.2), for
// TestRuntimeLibraryV112: a module of its own, so that the agent's module
// keeps the current library.
module libcni112

go 1.22

require github.com/containernetworking/cni v1.1.2

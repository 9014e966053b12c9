// Package bpf is the datapath: the BPF programs in C, the headers they share
// (include/), and the Go bindings that bpf2go generates from them.
//
// The generated files (*_bpfel.go and the *_bpfel.o they embed) are
// committed, so building the agent needs no clang; `go generate ./bpf/...`
// rebuilds them, and CI checks that doing so changes nothing.
//
// Maps are not the loader's: cells declare them through the bpf-maps
// registry (cells/bpfmaps), which pins them and keeps them across
// restarts, and programs get them with
// ebpf.CollectionOptions.MapReplacements. The C declaration of a map only
// tells the verifier its layout; the registry's Spec must match it, which
// loading checks.
//
// The compile flags, and why:
//   - -target bpfel: the agent runs on little-endian machines only
//     (amd64, arm64), so there is no big-endian object to keep in sync.
//   - -cc clang-19 -strip llvm-strip-19: Debian's versioned binaries. The
//     object depends on the compiler (and libbpf-dev) version, so CI must
//     use the same ones.
//   - -mcpu=v3: ALU32 and 32-bit jumps (Linux 5.1+); bpf2go's default v1
//     makes worse code and hits verifier limits sooner.
//   - -I/usr/include/x86_64-linux-gnu: Debian keeps asm/types.h there, and
//     clang -target bpf does not look in the multiarch directory.
//   - Reproducible output, so CI can regenerate in its own checkout and
//     require `git diff --exit-code bpf/` to be empty: the BTF line info,
//     which the strip keeps, names the source file as clang was given it,
//     and bpf2go gives it an absolute path. bpf2go also passes
//     -fdebug-prefix-map=<this dir>=. and -fdebug-compilation-dir=., so the
//     object says ./counter.c wherever the checkout is; -Iinclude is
//     relative for the same reason. Checked by generating in a copy of the
//     repository at another path: the objects are byte-for-byte identical.
//     Without the prefix map the path of the checkout ends up in the object.
package bpf

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -Iinclude -I/usr/include/x86_64-linux-gnu" Counter counter.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -output-stem sock_lb -cflags "-O2 -g -mcpu=v3 -Wall -Werror -Iinclude -I/usr/include/x86_64-linux-gnu" SockLB sock_lb.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -output-stem lxc -cflags "-O2 -g -mcpu=v3 -Wall -Werror -Iinclude -I/usr/include/x86_64-linux-gnu" LXC lxc.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -output-stem nodeport -cflags "-O2 -g -mcpu=v3 -Wall -Werror -Iinclude -I/usr/include/x86_64-linux-gnu" NodePort nodeport.c

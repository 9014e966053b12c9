package masquerade

// NewKernelFullyRandom is NewKernel writing random-fully masquerade rules,
// for the benchmark's comparison.
func NewKernelFullyRandom(netnsFD int) *Kernel {
	k := NewKernel(netnsFD)
	k.fullyRandom = true
	return k
}

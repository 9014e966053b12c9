package k8sclient

// NewFileDecoder returns the manifests dir's decoder of one file, counting
// the objects it decoded, for the external BenchmarkDecodeFile (which
// imports k8sclienttest, and so cannot be in this package).
func NewFileDecoder() func(name string, data []byte) (int, error) {
	d := newDecoder()
	return func(name string, data []byte) (int, error) {
		objs, err := d.decodeFile(name, data)
		return len(objs), err
	}
}

// Package bench holds profi's overhead benchmark: what a probed CUDA call
// costs with no probe, with an empty uprobe (the floor), with empty probes
// where profi probes, and with profi attached by its own attacher in each
// kernel mode (a runtime launch traps in the runtime and in the driver),
// all measured in one run on the same stub functions.
//
// It is a benchmark, not a test: `go test ./...` runs nothing here. Run it
// with `make bench` (root needed); docs/BENCHMARK.md explains the method and
// the numbers.
package bench

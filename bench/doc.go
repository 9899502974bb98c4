// Package bench holds profi's overhead benchmark: what a probed CUDA call
// costs with no probe, with an empty uprobe (the floor) and with profi's own
// programs, all measured in one run on the same stub functions.
//
// It is a benchmark, not a test: `go test ./...` runs nothing here. Run it
// with `make bench` (root needed); docs/BENCHMARK.md explains the method and
// the numbers.
package bench

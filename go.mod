module github.com/profi-dev/profi

go 1.26.8

require (
	github.com/alecthomas/kong v1.17.0 // indirect
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.73.1 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

// Package k8s labels processes with their Kubernetes pod: it reads a
// process's /proc/PID/cgroup to find its pod UID and container ID (every
// kubelet cgroup layout of containerd, CRI-O and Docker, cgroup v1 and
// v2, systemd and cgroupfs drivers) and looks them up in a client-go pod
// informer filtered to this node (spec.nodeName).
//
// It reaches the aggregator only through an interface (aggregate.Enricher)
// and never reads BPF maps.
package k8s

// Package status holds the /status document: plain data types and their
// JSON names, nothing else. The agent fills them (collector.StatusSource);
// `profi explain` decodes them. It must import no other profi package and
// nothing heavy (cilium/ebpf, go-nvml, client-go): the operator tools link
// it without the agent's BPF and NVML code (dependency_test.go).
package status

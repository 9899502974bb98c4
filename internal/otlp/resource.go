package otlp

import (
	"maps"
	"os"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/profi-dev/profi/internal/config"
)

// Resource builds the resource of every push (docs/INTERFACE.md §6):
// service.name, service.version, service.instance.id and host.name (from
// HOSTNAME, else the kernel's host name), k8s.node.name (--node-name /
// NODE_NAME), then the --otlp-resource-attrs pairs, which override.
func Resource(cfg config.OTLPConfig, version, nodeName string, getenv func(string) string) *resource.Resource {
	attrs := map[string]string{
		"service.name":    cfg.ServiceName,
		"service.version": version,
	}
	host := getenv("HOSTNAME")
	if host == "" {
		// HOSTNAME is a shell variable: a daemon started without a shell
		// (systemd) may not have it.
		host, _ = os.Hostname()
	}
	if host != "" {
		attrs["service.instance.id"] = host
		attrs["host.name"] = host
	}
	if nodeName != "" {
		attrs["k8s.node.name"] = nodeName
	}
	maps.Copy(attrs, cfg.ResourceAttrs)
	kvs := make([]attribute.KeyValue, 0, len(attrs))
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		kvs = append(kvs, attribute.String(k, attrs[k]))
	}
	return resource.NewSchemaless(kvs...)
}

{{/* Names. */}}
{{- define "profi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "profi.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "profi.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "profi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "profi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "profi.labels" -}}
helm.sh/chart: {{ include "profi.chart" . }}
{{ include "profi.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{- define "profi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "profi.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The container port: the part of profi.listen after the last ':'. */}}
{{- define "profi.port" -}}
{{- $port := splitList ":" .Values.profi.listen | last -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "profi.listen %q: expected HOST:PORT" .Values.profi.listen) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{- define "profi.tlsEnabled" -}}
{{- if ne (toString .Values.profi.metricsTls.mode) "off" -}}true{{- end -}}
{{- end -}}

{{- define "profi.authEnabled" -}}
{{- if ne (toString .Values.profi.metricsAuth.mode) "off" -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the serving certificate. */}}
{{- define "profi.tlsSecretName" -}}
{{- if .Values.profi.metricsTls.existingSecret -}}
{{- .Values.profi.metricsTls.existingSecret -}}
{{- else -}}
{{- printf "%s-metrics-tls" (include "profi.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "profi.clientTlsSecretName" -}}
{{- default (printf "%s-client-tls" (include "profi.fullname" .)) .Values.serviceMonitor.clientCert.secretName -}}
{{- end -}}

{{- define "profi.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString .Values.image.tag)) -}}
{{- end -}}

{{/*
Validation of value combinations the agent would reject at startup
(interface.md 2.5), so `helm install` fails instead of a crash-looping pod.
*/}}
{{- define "profi.validate" -}}
{{- $tls := toString .Values.profi.metricsTls.mode -}}
{{- $auth := toString .Values.profi.metricsAuth.mode -}}
{{- if not (has $tls (list "off" "server" "mtls")) -}}
{{- fail (printf "profi.metricsTls.mode %q: expected off, server or mtls" $tls) -}}
{{- end -}}
{{- if not (has $auth (list "off" "bearer" "mtls-or-bearer")) -}}
{{- fail (printf "profi.metricsAuth.mode %q: expected off, bearer or mtls-or-bearer" $auth) -}}
{{- end -}}
{{- if and (ne $tls "off") (not .Values.profi.metricsTls.certManager.enabled) (not .Values.profi.metricsTls.existingSecret) -}}
{{- fail "profi.metricsTls.mode is not off: set profi.metricsTls.certManager.enabled or profi.metricsTls.existingSecret" -}}
{{- end -}}
{{- if and .Values.profi.metricsTls.certManager.enabled (not .Values.profi.metricsTls.certManager.issuerName) -}}
{{- fail "profi.metricsTls.certManager.enabled needs profi.metricsTls.certManager.issuerName" -}}
{{- end -}}
{{- if and (eq $auth "mtls-or-bearer") (ne $tls "mtls") -}}
{{- fail "profi.metricsAuth.mode mtls-or-bearer needs profi.metricsTls.mode mtls" -}}
{{- end -}}
{{- if and (eq $auth "bearer") (eq $tls "mtls") -}}
{{- fail "profi.metricsTls.mode mtls with profi.metricsAuth.mode bearer is rejected by the agent: use mtls-or-bearer" -}}
{{- end -}}
{{- if and (ne $auth "off") (eq $tls "off") -}}
{{- fail "profi.metricsAuth.mode bearer over plain HTTP would send every scraper's token in the clear: set profi.metricsTls.mode server (or mtls with mtls-or-bearer)" -}}
{{- end -}}
{{- if and .Values.profi.metricsTls.allowedClientSANs (ne $tls "mtls") -}}
{{- fail "profi.metricsTls.allowedClientSANs needs profi.metricsTls.mode mtls" -}}
{{- end -}}
{{- end -}}

{{/* The agent's arguments, one per flag of values.yaml. */}}
{{- define "profi.args" -}}
{{- $p := .Values.profi -}}
- {{ printf "--listen=%v" $p.listen | quote }}
- {{ printf "--proc-path=%v" $p.procPath | quote }}
- {{ printf "--kernel-mode=%v" $p.kernelMode | quote }}
- {{ printf "--probe-profile=%v" $p.probeProfile | quote }}
- {{ printf "--cudart=%v" $p.cudartPath | quote }}
- {{ printf "--refresh-interval=%v" $p.intervals.refreshSeconds | quote }}
- {{ printf "--gc-interval=%v" $p.intervals.gcSeconds | quote }}
- {{ printf "--report-interval=%v" $p.reportIntervalSeconds | quote }}
{{- if $p.enableNvtxTracing }}
- "--enable-nvtx-tracing"
{{- end }}
{{- if $p.disableNvml }}
- "--disable-nvml"
{{- end }}
- {{ printf "--nvml-interval=%v" $p.intervals.nvmlSeconds | quote }}
- {{ printf "--gpm=%v" $p.gpm | quote }}
- {{ printf "--gpm-interval=%v" $p.intervals.gpmSeconds | quote }}
- {{ printf "--nccl-hang-timeout=%v" $p.nccl.hangTimeoutSeconds | quote }}
- {{ printf "--max-time-series=%d" (int64 $p.cardinality.maxTimeSeries) | quote }}
- {{ printf "--max-streams-per-pid=%v" $p.cardinality.maxStreamsPerPid | quote }}
- {{ printf "--max-kernels-per-pid=%v" $p.cardinality.maxKernelsPerPid | quote }}
- {{ printf "--max-attached-files-per-pid=%v" $p.cardinality.maxAttachedFilesPerPid | quote }}
- {{ printf "--max-attached-files=%v" $p.cardinality.maxAttachedFiles | quote }}
- {{ printf "--max-probe-descriptors=%v" $p.cardinality.maxProbeDescriptors | quote }}
- {{ printf "--max-teardown=%v" (max 1 (sub (int .Values.terminationGracePeriodSeconds) 15)) | quote }}
- {{ printf "--sample-rate=%v" $p.cardinality.sampleRate | quote }}
{{- if $p.cardinality.detailedLaunches }}
- "--detailed-launches"
{{- end }}
- {{ printf "--entries-size=%d" (int64 $p.ebpfMaps.entriesSize) | quote }}
- {{ printf "--aggregated-size=%d" (int64 $p.ebpfMaps.aggregatedSize) | quote }}
- {{ printf "--launch-agg-size=%d" (int64 $p.ebpfMaps.launchAggSize) | quote }}
- {{ printf "--malloc-sizes-size=%d" (int64 $p.ebpfMaps.mallocSizesSize) | quote }}
- {{ printf "--overhead-budget=%v" $p.overheadBudgetPercent | quote }}
- {{ printf "--crash-window=%v" $p.safety.crashWindowSeconds | quote }}
- {{ printf "--quarantine-lift=%v" $p.safety.quarantineLiftSeconds | quote }}
{{- if $p.safety.allowUnsafeKernel }}
- "--allow-unsafe-kernel"
{{- end }}
- {{ printf "--probe-traced-processes=%v" $p.safety.probeTracedProcesses | quote }}
- {{ printf "--kernel-log=%s" (include "profi.kernelLog" .) | quote }}
{{- with $p.otlp }}
{{- if .endpoint }}
- {{ printf "--otlp-endpoint=%v" .endpoint | quote }}
- {{ printf "--otlp-protocol=%v" .protocol | quote }}
- {{ printf "--otlp-interval-secs=%v" .intervalSeconds | quote }}
- {{ printf "--otlp-timeout-secs=%v" .timeoutSeconds | quote }}
- {{ printf "--otlp-service-name=%v" .serviceName | quote }}
{{- if .headers }}
- {{ printf "--otlp-headers=%v" .headers | quote }}
{{- end }}
{{- if .caCert }}
- {{ printf "--otlp-ca-cert=%v" .caCert | quote }}
{{- end }}
{{- if .clientCert }}
- {{ printf "--otlp-client-cert=%v" .clientCert | quote }}
{{- end }}
{{- if .clientKey }}
- {{ printf "--otlp-client-key=%v" .clientKey | quote }}
{{- end }}
{{- if .insecure }}
- "--otlp-insecure"
{{- end }}
{{- if .resourceAttrs }}
- {{ printf "--otlp-resource-attrs=%v" .resourceAttrs | quote }}
{{- end }}
{{- end }}
{{- end }}
- {{ printf "--metrics-tls-mode=%v" $p.metricsTls.mode | quote }}
{{- if include "profi.tlsEnabled" . }}
- --metrics-tls-cert=/etc/profi/tls/tls.crt
- --metrics-tls-key=/etc/profi/tls/tls.key
{{- if eq (toString $p.metricsTls.mode) "mtls" }}
- --metrics-tls-client-ca=/etc/profi/tls/ca.crt
{{- with $p.metricsTls.allowedClientSANs }}
- {{ printf "--metrics-tls-allowed-client-sans=%s" (join "," .) | quote }}
{{- end }}
{{- end }}
{{- end }}
- {{ printf "--metrics-auth-mode=%v" $p.metricsAuth.mode | quote }}
{{- if include "profi.authEnabled" . }}
{{- if $p.metricsAuth.audience }}
- {{ printf "--metrics-auth-audience=%v" $p.metricsAuth.audience | quote }}
{{- end }}
- {{ printf "--metrics-auth-cache-ttl=%v" $p.metricsAuth.cacheTtlSeconds | quote }}
- {{ printf "--metrics-auth-cache-size=%v" $p.metricsAuth.cacheSize | quote }}
{{- if $p.metricsAuth.authorize }}
- --metrics-auth-authorize
{{- end }}
{{- end }}
{{- range $p.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "profi.env" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: RUST_LOG
  value: {{ .Values.profi.logLevel | quote }}
{{- if .Values.nvidia.enabled }}
- name: NVIDIA_VISIBLE_DEVICES
  value: {{ .Values.nvidia.visibleDevices | quote }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: {{ .Values.nvidia.driverCapabilities | quote }}
{{- end }}
{{- if dig "limits" "memory" "" .Values.resources }}
{{- /* Go's soft memory limit at the container's limit: the GC works harder
       before the kernel would OOM-kill the agent. extraEnv can override it. */}}
- name: GOMEMLIMIT
  valueFrom:
    resourceFieldRef:
      containerName: profi
      resource: limits.memory
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "profi.volumeMounts" -}}
- name: host-proc
  mountPath: {{ .Values.profi.procPath }}
  readOnly: true
{{- if include "profi.tlsEnabled" . }}
- name: metrics-tls
  mountPath: /etc/profi/tls
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
"true" when the cluster serves the Prometheus Operator's kind (ServiceMonitor
or PrometheusRule, the argument's .kind): the chart renders those objects only
then, so `helm install` with the defaults works on a cluster without the
operator's CRDs (NOTES.txt says what was left out). `helm template` has no
cluster: pass --api-versions monitoring.coreos.com/v1/ServiceMonitor (and
/PrometheusRule) to render them.
*/}}
{{- define "profi.hasMonitoringAPI" -}}
{{- if .root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) -}}true{{- end -}}
{{- end -}}

{{/*
profi.kernelLog as the flag's value: auto or off. A bare YAML off (or
false) arrives as the boolean false, true as true.
*/}}
{{- define "profi.kernelLog" -}}
{{- $v := toString .Values.profi.kernelLog -}}
{{- if eq $v "false" -}}off{{- else if eq $v "true" -}}auto{{- else -}}{{ $v }}{{- end -}}
{{- end -}}

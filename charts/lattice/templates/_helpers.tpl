{{/* Labels on every object: which product and release it belongs to. */}}
{{- define "lattice.labels" -}}
app.kubernetes.io/part-of: lattice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "lattice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The scheduler's namespace: the release's (helm install -n NS --create-namespace),
unless scheduler.namespace names another one, which the chart then creates. */}}
{{- define "lattice.schedulerNamespace" -}}
{{ .Values.scheduler.namespace | default .Release.Namespace }}
{{- end }}

{{/* The scheduler's Lease: get/update are granted on this name only. */}}
{{- define "lattice.leaseName" -}}
{{ .Values.scheduler.leaderElection.leaseName | default .Values.scheduler.name }}
{{- end }}

{{/* The agent's identity as the API server sees it (the admission policy matches on it). */}}
{{- define "lattice.agentUser" -}}
system:serviceaccount:{{ .Values.agent.namespace }}:{{ .Values.agent.name }}
{{- end }}

{{/* Refuse values that would install something broken. */}}
{{- define "lattice.validate" -}}
{{- $s := .Values.scheduler -}}
{{- if and (gt (int $s.replicas) 1) (not $s.leaderElection.enabled) -}}
{{- fail "scheduler.replicas > 1 needs scheduler.leaderElection.enabled: two leaders would both bind" -}}
{{- end -}}
{{- if and .Values.agent.enabled (eq .Values.agent.namespace (include "lattice.schedulerNamespace" .)) -}}
{{- fail "agent.namespace must differ from scheduler.namespace: the agent's needs Pod Security level privileged, the scheduler's stays restricted" -}}
{{- end -}}
{{- if and .Values.agent.enabled (gt (float64 .Values.agent.sampleInterval) (float64 .Values.agent.reportInterval)) -}}
{{- fail "agent.sampleInterval must be at most agent.reportInterval" -}}
{{- end -}}
{{- end }}

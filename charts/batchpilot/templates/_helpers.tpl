{{/* Names, labels and the operator's permissions, shared by the templates. */}}

{{- define "batchpilot.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "batchpilot.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "batchpilot.operatorSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The labels the operator puts on every runtime pod and Service (children/common.py). */}}
{{- define "batchpilot.runtimeSelector" -}}
app.kubernetes.io/name: batchpilot-runtime
app.kubernetes.io/managed-by: batchpilot
{{- end -}}

{{/* The operator's leader-election Lease, in the release namespace. */}}
{{- define "batchpilot.leaseName" -}}
{{- include "batchpilot.fullname" . }}-operator
{{- end -}}

{{- define "batchpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "batchpilot.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "batchpilot.operatorImage" -}}
{{- $image := .Values.operator.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
What the operator does in the namespaces it serves — exactly, nothing more. Derived from the code
and checked against it by tests/deploy/test_rbac.py:
- kopf watches InferenceServices, patches them (progress annotations, finalizer) and their
  status; the operator reads one when a child changes and patches its status then too;
- kopf watches the children (kopf.on.event); the reconciler reads, creates and replaces them
  (the NetworkPolicy among them), deletes only the PodDisruptionBudget (none with one replica);
  the autopilot patches the Deployment's replicas and the batching ConfigMap, and reaches the
  ready pods through the operator's watch-fed cache (kopf lists and watches the runtime pods,
  selected by label); it reads and deletes the pod of a replica slower than its peers, for its
  ReplicaSet to start another;
- Events (kopf.event) on the InferenceService.
*/}}
{{- define "batchpilot.namespacedRules" -}}
- apiGroups: ["batchpilot.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["batchpilot.io"]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "update", "patch"]
- apiGroups: [""]
  resources: ["services", "secrets"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes", "grpcroutes"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/* kopf's own observation of the cluster: new CRDs always; namespaces when it serves a list
of them (to notice namespaces that come and go). Read-only, cluster-scoped by nature. */}}
{{- define "batchpilot.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}

{{/*
Leader election: get and update the one Lease by name; create cannot be restricted by name (the
object does not exist yet when it is checked), so it is granted on leases in the release
namespace, the way client-go's users do. Checked against the code by tests/deploy/test_rbac.py.
*/}}
{{- define "batchpilot.leaderElectionRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ include "batchpilot.leaseName" . | quote }}]
  verbs: ["get", "update"]
{{- end -}}

{{/* The names of a list of LocalObjectReferences ([{name: a}, {name: b}]), as a JSON list. */}}
{{- define "batchpilot.names" -}}
{{- $names := list -}}
{{- range . -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $names | toJson -}}
{{- end -}}

{{/* A Prometheus duration ("15s", "1m30s", "500ms") in seconds. */}}
{{- define "batchpilot.seconds" -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $n := float64 (regexFind "^[0-9]+" .) -}}
{{- $unit := regexFind "(ms|s|m|h)$" . -}}
{{- $scale := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total = addf $total (mulf $n (index $scale $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

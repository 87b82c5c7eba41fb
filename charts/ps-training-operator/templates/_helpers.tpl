{{/* Chart name, overridable. */}}
{{- define "psoperator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name of every object: the release name alone when it already names the chart. */}}
{{- define "psoperator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "psoperator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "psoperator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "psoperator.labels" -}}
{{ include "psoperator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "psoperator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "psoperator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the key the chiefs' tokens are derived from: the chart's, or the user's. */}}
{{- define "psoperator.chiefKeySecret" -}}
{{- default (printf "%s-chief-key" (include "psoperator.fullname" .)) .Values.chiefKey.existingSecret }}
{{- end }}

{{- define "psoperator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* What the operator does in the namespaces of its jobs: a Role each, or the ClusterRole. */}}
{{- define "psoperator.namespacedRules" -}}
# The jobs themselves: kopf patches status, its progress annotations and removes the finalizer
# earlier versions put; the TTL of a finished job deletes it.
- apiGroups: ["psoperator.io"]
  resources: ["pstrainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["psoperator.io"]
  resources: ["pstrainingjobs/status"]
  verbs: ["patch"]
# Children carry an owner reference with blockOwnerDeletion, which clusters running the
# OwnerReferencesPermissionEnforcement admission plugin allow only with this.
- apiGroups: ["psoperator.io"]
  resources: ["pstrainingjobs/finalizers"]
  verbs: ["update"]
# The children the operator lists and watches, creates (POST), changes (server-side apply: PATCH)
# and replaces; never read one by one.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Each job's NetworkPolicies (spec.networkPolicy): watched with the other children, created,
# applied, deleted when switched off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Pods are created by the StatefulSets and Jobs; the operator observes them and deletes them on
# restart, on a lost node and at clean-up.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Each chief's token Secret, made with its Job. Create only: the operator reads no Secret of any
# tenant (no get, list or watch); it derives each token from its own key.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- if .Values.kueue.enabled }}
# A queued job's Workload (the label kueue.x-k8s.io/queue-name): made, watched, deleted when its
# shape changes; its status told that the job stopped after an eviction, runs, or finished.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{/* Cluster-scoped reads, in every mode. */}}
{{- define "psoperator.clusterRules" -}}
# Nodes are watched (their Ready condition only is kept): a node lost for
# failurePolicy.nodeLostTimeoutSeconds gets the operator's pods on it force-deleted.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# kopf: CRD discovery for the resources it serves.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.kueue.enabled }}
# Kueue: the flavors an admission names (their node labels and tolerations) and the priority
# classes queued jobs name.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/*
Kubernetes 1.28 or newer (the pods' index label, see docs/concepts/roles.md): checked where Helm talks to a cluster
(install, upgrade, `--dry-run=server`), whose version Helm reads from the API server. A `kubeVersion`
in Chart.yaml would also be checked by `helm template` and `helm lint` against Helm's offline default
(v1.20.0 in a Helm built from source), and refuse to render there; `lookup` answers nothing offline.
*/}}
{{- define "psoperator.requireKubeVersion" -}}
{{- $minimum := "1.28.0-0" }}
{{- if and (lookup "v1" "Namespace" "" "kube-system") (semverCompare (printf "<%s" $minimum) .Capabilities.KubeVersion.Version) }}
{{- fail (printf "ps-training-operator needs Kubernetes >= 1.28; this cluster serves %s" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}

// Package deploy holds the kustomize base of the DaemonSet; RBAC is its
// rbac.yaml, for what applies the same RBAC outside a cluster (cellium-dev
// cluster up --identity-allocation-mode=crd).
package deploy

import _ "embed"

// RBAC is rbac.yaml: the agent's ServiceAccount, ClusterRole and
// ClusterRoleBinding, as YAML documents.
//
//go:embed rbac.yaml
var RBAC []byte

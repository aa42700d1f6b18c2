package kube

import (
	"context"
	"fmt"
	"strings"

	authv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// permission is one RBAC rule boxrt needs in its namespace.
type permission struct {
	group, resource string
	verbs           []string
}

// permissions is everything the backend does in the namespace, and so the
// minimal Role. pods/exec needs get too: the WebSocket exec is a GET, which
// RBAC authorises as the verb get (SPDY's POST as create).
var permissions = []permission{
	{"", "pods", []string{"create", "delete", "get", "list", "patch"}},
	{"", "pods/exec", []string{"create", "get"}},
	{"", "persistentvolumeclaims", []string{"create", "delete", "get", "list", "patch"}},
	{"networking.k8s.io", "networkpolicies", []string{"create", "delete", "get", "list"}},
	// The index of sessions claimed from a warm pool (pool.go).
	{"", "configmaps", []string{"create", "delete", "get", "list", "patch"}},
}

// String names the permission as `verb group/resource` for messages.
func permName(verb, group, resource string) string {
	if group != "" {
		return verb + " " + group + "/" + resource
	}
	return verb + " " + resource
}

// MissingPermissions asks the API server (SelfSubjectAccessReview) which of
// the permissions boxrt needs in its namespace it lacks, as "verb resource"
// strings. An empty list means the identity may do everything boxrt does.
func (b *Backend) MissingPermissions(ctx context.Context) ([]string, error) {
	if b.configErr != nil {
		return nil, b.configErr
	}
	var missing []string
	for _, p := range permissions {
		resource, sub, _ := strings.Cut(p.resource, "/")
		for _, verb := range p.verbs {
			r, err := b.accessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
				Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{
					Namespace: b.ns, Verb: verb, Group: p.group, Resource: resource, Subresource: sub,
				}},
			}, metav1.CreateOptions{})
			if err != nil {
				return nil, b.apiError("checking RBAC permissions (SelfSubjectAccessReview)", err)
			}
			if !r.Status.Allowed {
				missing = append(missing, permName(verb, p.group, p.resource))
			}
		}
	}
	return missing, nil
}

// MinimalRole renders the Role (and a RoleBinding to serviceAccount) that
// grants exactly what boxrt needs in namespace.
func MinimalRole(namespace, serviceAccount string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: boxrt\n  namespace: %s\nrules:\n", namespace)
	for _, p := range permissions {
		fmt.Fprintf(&sb, "- apiGroups: [%q]\n  resources: [%q]\n  verbs: [%s]\n", p.group, p.resource, quoteList(p.verbs))
	}
	fmt.Fprintf(&sb, "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: boxrt\n  namespace: %s\n", namespace)
	fmt.Fprintf(&sb, "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: boxrt}\n")
	fmt.Fprintf(&sb, "subjects:\n- {kind: ServiceAccount, name: %s, namespace: %s}\n", serviceAccount, namespace)
	return sb.String()
}

func quoteList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

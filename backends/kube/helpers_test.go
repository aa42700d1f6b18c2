package kube_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/boxrt/boxrt/backends/kube"
)

// readCloser gives a process's stdout the Close the MCP transport wants.
type readCloser struct{ io.Reader }

func (readCloser) Close() error { return nil }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newBackendAt(kubeconfig string) (*kube.Backend, error) {
	return kube.New(kube.Config{InstanceID: "test-" + randomID(), Kubeconfig: kubeconfig, Namespace: testNamespace, Image: testImage})
}

// writeKubeconfig writes a kubeconfig for server (the test cluster's CA)
// authenticating with token ("" for none).
func writeKubeconfig(t *testing.T, path, server, token string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: adminRC.TLSClientConfig.CAFile, CertificateAuthorityData: adminRC.TLSClientConfig.CAData}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u", Namespace: testNamespace}
	cfg.CurrentContext = "x"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// limitedToken returns a token of a ServiceAccount that may only get and
// list pods in the test namespace.
func limitedToken(t *testing.T) string {
	t.Helper()
	const name = "boxrt-limited"
	bind(t, name, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}},
	})
	return saToken(t, name)
}

// applyMinimalRole creates ServiceAccount sa bound to the Role (and
// RoleBinding) kube.MinimalRole renders, decoded from its YAML as an
// operator's kubectl apply would.
func applyMinimalRole(t *testing.T, sa string) {
	t.Helper()
	docs := strings.Split(kube.MinimalRole(testNamespace, sa), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("MinimalRole: %d YAML documents, want Role and RoleBinding", len(docs))
	}
	var role rbacv1.Role
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &role); err != nil {
		t.Fatalf("MinimalRole's Role: %v", err)
	}
	role.Name = sa // one Role per test, not the shared name "boxrt"
	bind(t, sa, &role)
}

// bind creates ServiceAccount name, role and a RoleBinding between them.
func bind(t *testing.T, name string, role *rbacv1.Role) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace}}
	if _, err := admin.CoreV1().ServiceAccounts(testNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(testNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: testNamespace}},
	}
	if _, err := admin.RbacV1().RoleBindings(testNamespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = admin.RbacV1().RoleBindings(testNamespace).Delete(ctx, name, metav1.DeleteOptions{})
		_ = admin.RbacV1().Roles(testNamespace).Delete(ctx, role.Name, metav1.DeleteOptions{})
		_ = admin.CoreV1().ServiceAccounts(testNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// saToken returns a short-lived token of ServiceAccount name.
func saToken(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exp := int64(600)
	tok, err := admin.CoreV1().ServiceAccounts(testNamespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}

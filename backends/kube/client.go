package kube

import (
	"context"
	"fmt"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// The backend talks to the API server through client-go's REST layer with
// a scheme of its own that knows only the types below, instead of the
// generated clientset and its scheme: those register every API group and
// link every typed client, which tripled the binary and the idle RSS of
// every boxrt, kube backend or not (docs/operations.md).
var (
	apiScheme      = runtime.NewScheme()
	apiCodecs      = serializer.NewCodecFactory(apiScheme)
	parameterCodec = runtime.NewParameterCodec(apiScheme)
)

func init() {
	apiScheme.AddKnownTypes(corev1.SchemeGroupVersion,
		&corev1.Pod{}, &corev1.PodList{},
		&corev1.PersistentVolumeClaim{}, &corev1.PersistentVolumeClaimList{},
		&corev1.ConfigMap{}, &corev1.ConfigMapList{},
		&corev1.PodExecOptions{})
	apiScheme.AddKnownTypes(networkingv1.SchemeGroupVersion, &networkingv1.NetworkPolicy{}, &networkingv1.NetworkPolicyList{})
	apiScheme.AddKnownTypes(authv1.SchemeGroupVersion, &authv1.SelfSubjectAccessReview{})
	// The options, Status and the other meta types, in every group version
	// the backend calls (as each group's AddToScheme does).
	for _, gv := range []schema.GroupVersion{corev1.SchemeGroupVersion, networkingv1.SchemeGroupVersion, authv1.SchemeGroupVersion} {
		metav1.AddToGroupVersion(apiScheme, gv)
	}
}

// apiClients holds one REST client per API group version the backend
// calls, sharing one HTTP client (connections) and one rate limiter, as a
// clientset's groups do.
type apiClients struct {
	core, networking, authorization *rest.RESTClient
}

// newAPIClients builds the REST clients from rc.
func newAPIClients(rc *rest.Config) (apiClients, error) {
	base := *rc
	if base.UserAgent == "" {
		base.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if base.RateLimiter == nil && base.QPS > 0 {
		base.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(base.QPS, base.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&base)
	if err != nil {
		return apiClients{}, err
	}
	client := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := base
		c.APIPath, c.GroupVersion = apiPath, &gv
		c.NegotiatedSerializer = apiCodecs.WithoutConversion()
		rc, err := rest.RESTClientForConfigAndClient(&c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("REST client for %s: %w", gv, err)
		}
		return rc, nil
	}
	var a apiClients
	if a.core, err = client("/api", corev1.SchemeGroupVersion); err != nil {
		return apiClients{}, err
	}
	if a.networking, err = client("/apis", networkingv1.SchemeGroupVersion); err != nil {
		return apiClients{}, err
	}
	if a.authorization, err = client("/apis", authv1.SchemeGroupVersion); err != nil {
		return apiClients{}, err
	}
	return a, nil
}

// object is a pointer to an API type of apiScheme.
type object[T any] interface {
	*T
	runtime.Object
}

// typedClient reads and writes one resource of one namespace ("" for a
// cluster-scoped resource). Its methods have the signatures of client-go's
// generated typed clients: T is the item, L the list.
type typedClient[T any, PT object[T], L any, PL object[L]] struct {
	rc       *rest.RESTClient
	ns       string
	resource string
}

// The resources the backend uses.
type (
	podClient    = typedClient[corev1.Pod, *corev1.Pod, corev1.PodList, *corev1.PodList]
	pvcClient    = typedClient[corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaim, corev1.PersistentVolumeClaimList, *corev1.PersistentVolumeClaimList]
	netpolClient = typedClient[networkingv1.NetworkPolicy, *networkingv1.NetworkPolicy, networkingv1.NetworkPolicyList, *networkingv1.NetworkPolicyList]
	// ConfigMaps are the warm pool's claim index (pool.go).
	configMapClient = typedClient[corev1.ConfigMap, *corev1.ConfigMap, corev1.ConfigMapList, *corev1.ConfigMapList]
	// SelfSubjectAccessReviews are create-only: no list type.
	reviewClient = typedClient[authv1.SelfSubjectAccessReview, *authv1.SelfSubjectAccessReview, authv1.SelfSubjectAccessReview, *authv1.SelfSubjectAccessReview]
)

func (b *Backend) pods() podClient {
	return podClient{b.api.core, b.ns, "pods"}
}

func (b *Backend) pvcs() pvcClient {
	return pvcClient{b.api.core, b.ns, "persistentvolumeclaims"}
}

func (b *Backend) netpols() netpolClient {
	return netpolClient{b.api.networking, b.ns, "networkpolicies"}
}

func (b *Backend) configMaps() configMapClient {
	return configMapClient{b.api.core, b.ns, "configmaps"}
}

// accessReviews is cluster-scoped.
func (b *Backend) accessReviews() reviewClient {
	return reviewClient{b.api.authorization, "", "selfsubjectaccessreviews"}
}

// on points r at the resource, in its namespace if it has one.
func (c typedClient[T, PT, L, PL]) on(r *rest.Request) *rest.Request {
	return r.NamespaceIfScoped(c.ns, c.ns != "").Resource(c.resource)
}

func (c typedClient[T, PT, L, PL]) Create(ctx context.Context, obj PT, opts metav1.CreateOptions) (PT, error) {
	out := PT(new(T))
	err := c.on(c.rc.Post()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (c typedClient[T, PT, L, PL]) Get(ctx context.Context, name string, opts metav1.GetOptions) (PT, error) {
	out := PT(new(T))
	err := c.on(c.rc.Get()).Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

func (c typedClient[T, PT, L, PL]) List(ctx context.Context, opts metav1.ListOptions) (PL, error) {
	out := PL(new(L))
	err := c.on(c.rc.Get()).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

func (c typedClient[T, PT, L, PL]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.on(c.rc.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

func (c typedClient[T, PT, L, PL]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (PT, error) {
	out := PT(new(T))
	err := c.on(c.rc.Patch(pt)).Name(name).VersionedParams(&opts, parameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

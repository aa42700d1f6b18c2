package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"sync"
	"time"
)

// sessionCA is a session's own certificate authority, generated in memory:
// its certificate goes into the sandbox's trust store, its key never
// leaves boxrt. Name constraints limit it to the hosts that carry a
// secret, so even a client that trusts it accepts it for nothing else.
type sessionCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// caLifetime outlives any session; leaves are short and re-issued.
const (
	caLifetime    = 2 * 365 * 24 * time.Hour
	leafLifetime  = 7 * 24 * time.Hour
	maxLeafCached = 64
)

func newSessionCA(label string, secrets []sessionSecret) (*sessionCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	var permitted []string
	for _, s := range secrets {
		for _, h := range s.hosts {
			if h.Host != "" {
				permitted = append(permitted, h.Host)
			} else {
				permitted = append(permitted, h.Suffix)
			}
		}
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "boxrt egress " + clipText(label), Organization: []string{"boxrt"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caLifetime),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &sessionCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{}}, nil
}

// sessionCAFor is the CA the identity kept, when it has a usable one, else
// a new one.
func sessionCAFor(label string, secrets []sessionSecret, id Identity) (*sessionCA, error) {
	if len(id.CAKey) == 0 || len(id.CACert) == 0 {
		return newSessionCA(label, secrets)
	}
	cert, err := x509.ParseCertificate(id.CACert)
	if err != nil {
		return nil, fmt.Errorf("the kept session CA: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(id.CAKey)
	key, ok := k.(*ecdsa.PrivateKey)
	if err != nil || !ok || !key.PublicKey.Equal(cert.PublicKey) || !cert.IsCA {
		return nil, errors.New("the kept session CA's key does not match its certificate")
	}
	return &sessionCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		leaves: map[string]*tls.Certificate{}}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// leaf is a certificate for name signed by the CA, cached while fresh.
func (ca *sessionCA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && time.Until(c.Leaf.NotAfter) > leafLifetime/2 {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: parsed}
	if len(ca.leaves) >= maxLeafCached {
		clear(ca.leaves)
	}
	ca.leaves[name] = c
	return c, nil
}

// systemBundles are where Linux distributions keep the trusted roots (the
// list Go's crypto/x509 reads).
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// bundle is the host's trusted roots followed by the CA: what a sandbox
// client that reads one file (SSL_CERT_FILE, REQUESTS_CA_BUNDLE) needs.
func (ca *sessionCA) bundle() ([]byte, error) {
	for _, path := range systemBundles {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !strings.HasSuffix(string(b), "\n") {
			b = append(b, '\n')
		}
		return append(b, ca.pem...), nil
	}
	return append([]byte(nil), ca.pem...), nil
}

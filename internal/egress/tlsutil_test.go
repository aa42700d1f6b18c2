package egress

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"time"
)

func tlsClient(c net.Conn, name string, roots *x509.CertPool) *tls.Conn {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return tls.Client(c, &tls.Config{ServerName: name, RootCAs: roots})
}

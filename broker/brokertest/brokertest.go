// Package brokertest starts embedded brokers for tests, the way
// net/http/httptest starts servers. Only tests import it, so the
// binaries do not link package testing.
package brokertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/passwd"
)

// Start starts a broker on a free port of 127.0.0.1 that lets every
// client in, and closes it when the test ends.
func Start(tb testing.TB) *broker.Broker {
	tb.Helper()
	return StartWith(tb, broker.Options{})
}

// StartWith starts a broker with opts on a free port of 127.0.0.1 (any
// Addr in opts is replaced) and closes it when the test ends.
func StartWith(tb testing.TB, opts broker.Options) *broker.Broker {
	tb.Helper()
	opts.Addr = "127.0.0.1:0"
	b, err := broker.Start(opts)
	if err != nil {
		tb.Fatalf("start broker: %v", err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("close broker: %v", err)
		}
	})
	return b
}

// StartACL starts a broker like Start with one user, who logs in with
// password and may publish and subscribe where allow says (write is
// true for a publish).
func StartACL(tb testing.TB, user, password string, allow func(topic string, write bool) bool) *broker.Broker {
	tb.Helper()
	hash, err := passwd.HashCost(password, 1) // the lowest cost: tests log in often
	if err != nil {
		tb.Fatal(err)
	}
	cred, err := passwd.Parse(hash)
	if err != nil {
		tb.Fatal(err)
	}
	users := passwd.NewBook()
	users.Add(user, cred)
	auth, err := broker.NewAuth(broker.AuthOptions{
		Users: users,
		Allow: func(_, topic string, write bool) bool { return allow(topic, write) },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return StartWith(tb, broker.Options{Auth: auth})
}

// SelfSigned writes a certificate for 127.0.0.1 and localhost and its
// key into dir, for a broker (or any listener) that speaks TLS in a
// test, and returns their paths and a pool that trusts the certificate.
func SelfSigned(tb testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sortie test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "test.crt"), filepath.Join(dir, "test.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

package conf_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/conf"
)

// handshake dials a TLS listener serving server with client and reports
// the client's handshake error.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // the test's own listener
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake() // its outcome is the client's to report
		_ = c.Close()
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err != nil {
		return err
	}
	return c.Close()
}

// TestPinnedTLSTrustsOnlyItsOwnCertificate: a process's own clients reach
// its listener by any address with the pinned setup, and the same setup
// refuses a listener serving another certificate.
func TestPinnedTLSTrustsOnlyItsOwnCertificate(t *testing.T) {
	cert, key, _ := brokertest.SelfSigned(t, t.TempDir())
	server, self, err := conf.PinnedTLS(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, server, self); err != nil {
		t.Errorf("own certificate refused: %v", err)
	}
	otherCert, otherKey, _ := brokertest.SelfSigned(t, t.TempDir())
	other, _, err := conf.PinnedTLS(otherCert, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, other, self); err == nil {
		t.Error("another certificate was trusted")
	}
	if _, _, err := conf.PinnedTLS(cert, cert); err == nil {
		t.Error("a certificate as its own key was accepted")
	}
}

func TestClientTLS(t *testing.T) {
	if tc, err := conf.ClientTLS("", "", "", false); tc != nil || err != nil {
		t.Errorf("nothing set: %v, %v; want nil, nil (the URL decides)", tc, err)
	}
	cert, key, _ := brokertest.SelfSigned(t, t.TempDir())
	server, _, err := conf.PinnedTLS(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := conf.ClientTLS(cert, "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	tc.ServerName = "localhost"
	if err := handshake(t, server, tc); err != nil {
		t.Errorf("the CA file's certificate refused: %v", err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := conf.ClientTLS(notPEM, "", "", false); err == nil {
		t.Error("a CA file without a certificate was accepted")
	}
	if _, err := conf.ClientTLS(filepath.Join(t.TempDir(), "missing.pem"), "", "", false); err == nil {
		t.Error("a missing CA file was accepted")
	}
	if tc, err := conf.ClientTLS("", cert, key, false); err != nil || len(tc.Certificates) != 1 {
		t.Errorf("client certificate: %v, %v", tc, err)
	}
}

func TestSecret(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		inline, file, want string
	}{
		{"inline", file, "inline"},
		{"", file, "s3cret"},
		{"", "", ""},
	} {
		if got, err := conf.Secret(c.inline, c.file); err != nil || got != c.want {
			t.Errorf("Secret(%q, %q) = %q, %v; want %q", c.inline, c.file, got, err, c.want)
		}
	}
	if _, err := conf.Secret("", filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing secret file was not an error")
	}
}

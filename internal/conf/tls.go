package conf

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ClientTLS builds a client's TLS settings from a CA file (the roots to
// trust; none means the system's), a client certificate and key, and an
// opt-in to skip verification. It returns nil when none is set: the
// connection's URL then decides whether TLS is used at all.
func ClientTLS(caFile, certFile, keyFile string, insecure bool) (*tls.Config, error) {
	if caFile == "" && certFile == "" && !insecure {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure} // opt-in, documented
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: %s holds no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// PinnedTLS loads a server certificate and key, and returns the server's
// TLS setup and a client setup that trusts exactly that certificate,
// whatever names it carries: a process's own clients (the agent's
// simulated home and command line, the hub's own connection) reach its
// listeners by address, and have the certificate itself to compare with.
func PinnedTLS(certFile, keyFile string) (server, self *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, err
	}
	leaf := cert.Certificate[0]
	server = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	self = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verification is VerifyPeerCertificate's: the one certificate
		// this process serves, byte for byte.
		InsecureSkipVerify: true, // pinned below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], leaf) {
				return errors.New("not this process's own certificate")
			}
			return nil
		},
	}
	return server, self, nil
}

// Secret returns inline when set, else the trimmed contents of file (a
// password or token kept out of the config file); "" when neither is.
func Secret(inline, file string) (string, error) {
	if inline != "" || file == "" {
		return inline, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

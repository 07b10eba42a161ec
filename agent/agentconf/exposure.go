package agentconf

import (
	"fmt"
	"net"
)

// ExposureWarnings are what the embedded broker's and the API's settings
// leave open beyond loopback, for run's log and validate's output.
func ExposureWarnings(c Config) []string {
	var out []string
	b := c.Broker
	if b.Embedded && !onLoopback(b.Listen) {
		switch {
		case len(b.Users) == 0:
			out = append(out, fmt.Sprintf("the embedded broker listens on %s with no [[broker.users]]: anyone who reaches it can send triggers and device commands (README: Who may use the embedded broker)", b.Listen))
		case b.ServerCertFile == "":
			out = append(out, fmt.Sprintf("the embedded broker listens on %s without TLS: its users' passwords cross the network in the clear (set server_cert_file and server_key_file)", b.Listen))
		}
	}
	h := c.HTTP
	if h.Listen != "" && !onLoopback(h.Listen) {
		switch {
		case h.Token == "" && h.TokenFile == "":
			out = append(out, fmt.Sprintf("the API listens on %s with no token: anyone who reaches it can run scenes and control missions (set http.token_file)", h.Listen))
		case h.CertFile == "":
			out = append(out, fmt.Sprintf("the API listens on %s without TLS: its token crosses the network in the clear (set http.cert_file and http.key_file)", h.Listen))
		}
	}
	return out
}

// onLoopback says whether a listen address is only reachable from this
// host.
func onLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return true // not an address: Validate says so
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

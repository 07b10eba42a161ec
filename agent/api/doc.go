// Package api is the agent's management API over HTTP (docs/api.md): the
// http.Handler the agent serves (missions, triggers, devices, scenes,
// backups, health), the request and response types, and a Client that
// the agent's command line is built on. The types are the contract: the
// CLI and other programs decode exactly what the handler encodes.
package api

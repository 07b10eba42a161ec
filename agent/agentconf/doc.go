// Package agentconf is the agent's configuration file (configs/agent.toml,
// commented key by key there): its model, its checks (Validate, the same
// the running agent and `agent validate` make), and its mapping onto
// agent.Options. cmd/agent reads it; an embedder may too.
package agentconf

"""Server side: the ServerApp (run config, results.json, per-round tables, resume), pre-training,
relation-vector estimation on proxy data, certificates, and the `fl-server` command."""

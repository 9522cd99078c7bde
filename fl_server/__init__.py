"""Server side: pre-training, relation-vector estimation on proxy data, and (later) the ServerApp."""

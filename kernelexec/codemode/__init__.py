"""Code mode: cells call the user's other MCP servers through a broker in the server (config.py: which servers;
broker.py: the calls, checked, approved, logged and recorded)."""

# Claude Code: register kernelexec for this project (writes to your local Claude config).
claude mcp add kernelexec -- kernelexec serve --profile standard --working-dir .
# ... or for every project of yours:
claude mcp add --scope user kernelexec -- kernelexec serve --profile standard
# ... or check it into the project as .mcp.json (same content as claude-code.mcp.json):
claude mcp add --scope project kernelexec -- kernelexec serve --profile standard --working-dir .

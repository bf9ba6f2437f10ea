#!/usr/bin/env bash
# Ask the demo agent a question as alice or bob. The agent (Claude Code in headless mode) gets
# the recall server's two tools (search, and read a conversation whole) and nothing else: no
# built-in tools, no other knowledge of the domain.
#
#   examples/ask.sh [-u alice|bob] "What did we decide about the N-11 upgrade?"
#
# Needs the seeded demo server on 127.0.0.1:8000: paste README.md's "Try the demo" block from
# the repository root (it installs, starts the server, seeds it and searches once). Needs the
# `claude` CLI on PATH; AGENT_CLI overrides the command name.
set -euo pipefail

usage() {
    echo "usage: $0 [-u alice|bob] \"question\"   (default user: alice)" >&2
    exit 2
}

user=alice
while getopts ":u:h" opt; do
    case "$opt" in
        u) user=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $# -eq 1 && -n $1 ]] || usage
question=$1

case "$user" in
    alice | bob) ;;
    *) echo "ask.sh: unknown demo user '$user' (alice or bob)" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cli=${AGENT_CLI:-claude}
if ! command -v "$cli" >/dev/null 2>&1; then
    echo "ask.sh: '$cli' not found; install Claude Code or set AGENT_CLI" >&2
    exit 127
fi

# --strict-mcp-config: only this server; --tools "": no built-in tools, so every answer comes
# from recalled passages; --allowedTools: both of the server's tools run without a permission
# prompt (a tool left out is refused in headless mode, where no one can answer the prompt).
exec "$cli" -p "$question" \
    --strict-mcp-config --mcp-config "$here/mcp-$user.json" \
    --tools "" \
    --allowedTools "mcp__recall__recall_my_conversations,mcp__recall__read_my_conversation" \
    --system-prompt "$(cat "$here/system.md")"

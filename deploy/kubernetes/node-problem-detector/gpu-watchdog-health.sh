#!/bin/sh
# node-problem-detector custom plugin: the gpu-watchdog daemon's node verdict as a node condition.
#
# Reads the daemon's GET /status on this node and turns its node verdict (the "node_health" object:
# level healthy|degraded|unhealthy, per GPU its findings; an object under "node" is read the same way)
# into NPD's custom-plugin answer - the exit status NPD defines and one line on stdout, the message:
#   0  OK       healthy, or degraded (working; a correctable ECC burst, a throttle, a PCIe width drop)
#   1  NonOK    unhealthy: a GPU or the node is not fit to run a job (Xid 79, uncorrectable ECC...)
#   2  Unknown  the daemon did not answer, or reports no node verdict
# The message names the unhealthy GPUs and their faults, e.g. "unhealthy: GPU 3 Xid 79".
#
# Environment: GPU_WATCHDOG_URL (default http://127.0.0.1:9410: the DaemonSet runs with hostNetwork),
# GPU_WATCHDOG_TIMEOUT_S (default 5; keep it under the plugin's "timeout" in gpu-watchdog-monitor.json).
# Needs python3, or curl (or wget) and jq, in the node-problem-detector image.
set -u
URL="${GPU_WATCHDOG_URL:-http://127.0.0.1:9410}"
TIMEOUT="${GPU_WATCHDOG_TIMEOUT_S:-5}"
OK=0
NONOK=1
UNKNOWN=2

if command -v python3 >/dev/null 2>&1; then
    exec python3 - "$URL" "$TIMEOUT" <<'PY'
import json
import sys
import urllib.request

LEVELS = ("healthy", "degraded", "unhealthy")
MAX_BYTES = 16 * 1024 * 1024
MAX_MESSAGE = 200


def say(code, text):
    text = "".join(c if c.isascii() and c.isprintable() else "?" for c in text)
    print(text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "...")
    sys.exit(code)


url, timeout = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=float(timeout)) as r:
        body = r.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError("/status too large")
    doc = json.loads(body)
except Exception as e:  # unreachable, HTTP error, not JSON: NPD's Unknown
    say(2, f"unknown: gpu-watchdog /status unreadable at {url} ({type(e).__name__})")
node = doc.get("node_health") if isinstance(doc, dict) else None
if not isinstance(node, dict) and isinstance(doc, dict):
    node = doc.get("node")
level = node.get("level") if isinstance(node, dict) else None
if level not in LEVELS:
    say(2, "unknown: the daemon reports no node verdict")
def listed(value):
    return value if isinstance(value, list) else []


def name(f):
    xid = f.get("xid")
    if isinstance(xid, int) and not isinstance(xid, bool):
        return f"Xid {xid}"
    return str(f.get("kind"))[:40]


faults = []
if level != "healthy":
    for g in listed(node.get("gpus")):
        if not isinstance(g, dict) or g.get("level") != level:
            continue
        gpu = g.get("gpu")
        where = f"GPU {gpu}" if isinstance(gpu, int) and not isinstance(gpu, bool) else "GPU ?"
        mine = [f"{where} {name(f)}" for f in listed(g.get("findings")) if isinstance(f, dict) and f.get("level") == level]
        faults.extend(mine or [where])
    faults.extend(
        f"node {name(f)}" for f in listed(node.get("findings")) if isinstance(f, dict) and f.get("level") == level
    )
text = f"{level}: " + ", ".join(dict.fromkeys(faults)) if faults else level
say(1 if level == "unhealthy" else 0, text)
PY
fi

if command -v jq >/dev/null 2>&1; then
    if command -v curl >/dev/null 2>&1; then
        body=$(curl -fsS --max-time "$TIMEOUT" --max-filesize 16777216 "${URL%/}/status" 2>/dev/null)
    elif command -v wget >/dev/null 2>&1; then
        body=$(wget -q -T "$TIMEOUT" -O - "${URL%/}/status" 2>/dev/null)
    else
        echo "unknown: neither python3, curl nor wget in the node-problem-detector image"
        exit $UNKNOWN
    fi
    if [ $? -ne 0 ] || [ -z "$body" ]; then
        echo "unknown: gpu-watchdog /status unreadable at $URL"
        exit $UNKNOWN
    fi
    line=$(printf '%s' "$body" | jq -r '
        ((if (.node_health | type) == "object" then .node_health else .node end) // null) as $n
        | if ($n | type) != "object" or ([$n.level] | inside(["healthy", "degraded", "unhealthy"]) | not)
          then "unknown"
          else $n.level as $l
            | def name: if (.xid | type) == "number" then "Xid \(.xid)" else "\(.kind)"[:40] end;
              [(($n.gpus | arrays) // [])[] | objects | select(.level == $l and $l != "healthy") as $g
               | ([(($g.findings | arrays) // [])[] | objects | select(.level == $l) | "GPU \($g.gpu) " + name]
                  | if length > 0 then .[] else "GPU \($g.gpu)" end)]
              + [(($n.findings | arrays) // [])[] | objects | select(.level == $l and $l != "healthy") | "node " + name]
            | (reduce .[] as $x ([]; if any(.[]; . == $x) then . else . + [$x] end)) as $f
            | if ($f | length) > 0 then "\($l): \($f | join(", "))" else $l end
          end' 2>/dev/null | head -c 200 | tr -cd '[:print:]')
    case "$line" in
        unhealthy*) echo "$line"; exit $NONOK ;;
        healthy*|degraded*) echo "$line"; exit $OK ;;
        *) echo "unknown: the daemon reports no node verdict"; exit $UNKNOWN ;;
    esac
fi
echo "unknown: neither python3 nor jq in the node-problem-detector image"
exit $UNKNOWN

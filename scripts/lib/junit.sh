# Sourced by scripts/test-matrix and scripts/test-kernels: a junit XML's counts.

# "N passed, N failed, N errors, N skipped" from a junit XML; exit 1 when nothing ran.
junit_counts() {
    python3 - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("no result (pytest died)")
    raise SystemExit(1)
n = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
    for k in n:
        n[k] += int(suite.get(k, 0))
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print(f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
raise SystemExit(0 if n["tests"] else 1)
EOF
}
